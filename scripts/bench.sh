#!/usr/bin/env bash
# Runs every benchmark but the Google Benchmark ones (kernels_bench, run by
# hand; cuda_kernels_bench, in scripts/gpu_check.sh) and writes its reports
# under BUILD_DIR/bench/.
# Usage: scripts/bench.sh BUILD_DIR      (what `make bench` runs)
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
build=$1
bin=$build/bin
out=$build/bench
mkdir -p "$out"

if [ ! -x "$bin/push_pull_bench" ]; then
  echo "bench: $bin/push_pull_bench is missing; build it with: ninja -C $build push_pull_bench" >&2
  exit 1
fi

reports=()

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# PushPull through local jobs over TCP and shared memory vs. raw loopback TCP
# (table on stdout, JSON), then MXNet's dist_sync pushing and pulling the
# same sizes and the plot of all four (.venv's matplotlib, .venv-mxnet).
echo "bench: push_pull_bench"
"$bin/push_pull_bench" --json "$out/push_pull.json" | tee "$out/push_pull.txt"
"$root/scripts/setup.sh" frameworks
"$root/.venv/bin/python" "$root/benchmarks/goodput_bench.py" --push-pull "$out/push_pull.json" --out "$out" |
  tee "$out/goodput.txt"
reports+=("$out/push_pull.json" "$out/push_pull.txt" "$out/goodput.json" "$out/goodput.png")

# Any other *_bench is a Google Benchmark binary.
shopt -s nullglob
for exe in "$bin"/*_bench; do
  name=$(basename "$exe")
  case $name in push_pull_bench | multihost_bench) continue ;; esac
  [ -x "$exe" ] || continue
  echo "bench: $name"
  "$exe" --benchmark_out="$out/$name.json" --benchmark_out_format=json | tee "$out/$name.txt"
  reports+=("$out/$name.json" "$out/$name.txt")
done

# One coordinator against the processes of 64 to 4096 hosts.
echo "bench: coordinator_load"
"$bin/coordinator_load" --checkpoint-every=0 --json "$out/coordinator_load.json" | tee "$out/coordinator_load.txt"
"$bin/coordinator_load" --hosts=64,256,1024,2048 --json "$out/coordinator_load_checkpoints.json" |
  tee "$out/coordinator_load_checkpoints.txt"
reports+=("$out/coordinator_load.json" "$out/coordinator_load.txt" "$out/coordinator_load_checkpoints.json"
          "$out/coordinator_load_checkpoints.txt")

# The trainer across three network-namespace hosts (plain, then shaped links)
# against the same job on loopback, in turns, and a communication-bound torch
# MLP on two of them through psrt and with DDP-gloo; says it skipped where not
# root. Then 2 hosts of 4 workers over 100 Mbit/s, summing on each host first
# and each pushing alone, in turns.
echo "bench: multihost_bench"
"$bin/multihost_bench" --torch "$root/.venv/bin/python" --torch-bench "$root/benchmarks/torch_bench.py" --scan-hosts=4,8,16 \
  --per-host=4 --per-host-rate=100mbit \
  --json "$out/multihost.json" | tee "$out/multihost.txt"
reports+=("$out/multihost.json" "$out/multihost.txt")

# The scaling model: calibrated on this machine, checked against the host scan
# on tbf-limited namespace hosts (skipped where not root), then its
# predictions for 8-256 GPUs and their plot (benchmarks/scaling/README.md).
echo "bench: scaling model"
mkdir -p "$out/scaling"
"$root/.venv/bin/python" "$root/benchmarks/scaling/calibrate.py" --build "$build" --out "$out/scaling" |
  tee "$out/scaling/calibrate.txt"
"$root/.venv/bin/python" "$root/benchmarks/scaling/validate.py" --build "$build" --out "$out/scaling" \
  --per-host=2,4 |
  tee "$out/scaling/validate.txt"
"$root/.venv/bin/python" "$root/benchmarks/scaling/predict.py" --out "$out/scaling" |
  tee "$out/scaling/predict.txt"
reports+=("$out/scaling/calibration.json" "$out/scaling/predictions.json" "$out/scaling/scaling.png")

# Loss against wall time in sync, async and ssp with one slowed worker
# (Python with matplotlib, from the .venv that `setup.sh python` makes).
echo "bench: consistency_bench"
"$root/scripts/setup.sh" python
"$root/.venv/bin/python" "$root/benchmarks/consistency_bench.py" --build "$build" --out "$out"
reports+=("$out/consistency.json" "$out/consistency.png")

# Checkpoint write and restore against dd and boto3 on the same bytes, and
# the training pause (moto's S3 server from the .venv that `setup.sh s3` makes).
echo "bench: checkpoint_bench"
"$root/scripts/setup.sh" s3
"$root/.venv/bin/python" "$root/benchmarks/checkpoint_bench.py" --build "$build" --out "$out" |
  tee "$out/checkpoint.txt"
reports+=("$out/checkpoint.json" "$out/checkpoint.txt")

# What "replicas": 1 costs: goodput and the trainer's samples/s with and without.
echo "bench: replica_bench"
"$root/.venv/bin/python" "$root/benchmarks/replica_bench.py" --build "$build" --out "$out" | tee "$out/replicas.txt"
reports+=("$out/replicas.json" "$out/replicas.txt")

# What a server joining and one leaving ("max_servers") cost a running sync job,
# against the same job with its servers fixed.
echo "bench: server_moves_bench"
"$root/.venv/bin/python" "$root/benchmarks/server_moves_bench.py" --build "$build" --out "$out" |
  tee "$out/server_moves.txt"
reports+=("$out/server_moves.json" "$out/server_moves.txt")

# PyTorch through psrt (fp32, fp16) against DistributedDataParallel with gloo.
echo "bench: torch_bench"
"$root/scripts/setup.sh" frameworks
"$root/.venv/bin/python" "$root/benchmarks/torch_bench.py" --build "$build" --out "$out" | tee "$out/torch.txt"
reports+=("$out/torch.json" "$out/torch.txt")

# A GPT-2-small-shaped Transformer (124M parameters, Adam) against DDP-gloo,
# with and without gradient clipping, and the servers' resident memory.
echo "bench: gpt2_bench"
"$root/.venv/bin/python" "$root/benchmarks/gpt2_bench.py" --build "$build" --out "$out" | tee "$out/gpt2.txt"
reports+=("$out/gpt2.json" "$out/gpt2.txt")

# The TensorFlow and MXNet plugins against MultiWorkerMirroredStrategy and
# MXNet's dist_sync.
echo "bench: frameworks_bench"
"$root/.venv/bin/python" "$root/benchmarks/frameworks_bench.py" --build "$build" --out "$out" |
  tee "$out/frameworks.txt"
reports+=("$out/frameworks.json" "$out/frameworks.txt")

# Sparse tables: rows/s pulled and pushed against torch's own lookups and
# SparseAdam updates, and the recsys demo with 1 and 2 servers.
echo "bench: sparse_bench"
"$root/.venv/bin/python" "$root/benchmarks/sparse_bench.py" --build "$build" --out "$out" | tee "$out/sparse.txt"
reports+=("$out/sparse.json" "$out/sparse.txt")

echo "bench: reports in $out/:"
for r in "${reports[@]}"; do echo "  $r"; done
