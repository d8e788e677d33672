#!/usr/bin/env bash
# One-shot GPU check: builds psrt with CUDA for this machine's GPU, runs the
# CUDA tests and benchmarks (conversion and compression on the device, the
# copy to the host) and a PyTorch CUDA model through a real psrt job, and
# prints their figures. Meant for a machine with an NVIDIA GPU; on one
# without, it says so and exits 0 after the build.
#
#   scripts/gpu_check.sh [BUILD_DIR]      (default: build-gpu)
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-gpu}
failed=0

step() { printf '\n== %s\n' "$*"; }

step "machine"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader
  cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')
else
  echo "no nvidia-smi: no GPU driver here"
  cap=""
fi
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null | head -1)
if [ -z "$nvcc" ]; then
  echo "gpu_check: no nvcc on PATH or in /usr/local/cuda/bin; cannot build the CUDA kernels" >&2
  exit 1
fi
"$nvcc" --version | tail -2
# The GPU's own architecture when one is there, else the defaults (80;90).
arch_flag=()
[ -n "$cap" ] && arch_flag=(-DCMAKE_CUDA_ARCHITECTURES="$cap")

python=$root/.venv/bin/python
torch_cuda=0
if [ -x "$python" ] && "$python" -c 'import torch, pybind11, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  torch_cuda=1
fi
# The Python package (psrt._psrt) too when the .venv has torch with CUDA.
py_flags=()
py_targets=()
if [ $torch_cuda -eq 1 ]; then
  py_flags=(-DPSRT_PYTHON=ON -DPython_EXECUTABLE="$python" -Dpybind11_DIR="$("$python" -m pybind11 --cmakedir)")
  py_targets=(_psrt psrt_python_sources)
fi

step "build ($build)"
start=$(date +%s)
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CUDA_COMPILER="$nvcc" "${arch_flag[@]}" "${py_flags[@]}" >/dev/null || exit 1
ninja -C "$build" -j"$(nproc)" cuda_kernels_test cuda_kernels_bench psrt-run psrt-server \
  psrt-coordinator psrt-worker psrt_c "${py_targets[@]}" || exit 1
echo "built in $(( $(date +%s) - start )) s"

if [ -z "$cap" ]; then
  echo "gpu_check: built; no GPU here, so nothing to run"
  exit 0
fi

step "CUDA kernels against the CPU ones (cuda_kernels_test)"
"$build/bin/cuda_kernels_test" --gtest_brief=1 || failed=1

step "CUDA kernels benchmark: conversion, compression, device-to-host (cuda_kernels_bench)"
"$build/bin/cuda_kernels_bench" --benchmark_min_time=0.2 || failed=1

step "PyTorch CUDA model through psrt"
if [ $torch_cuda -eq 1 ]; then
  PYTHONPATH=$build/python PSRT_BIN_DIR=$build/bin "$python" -m pytest -q -p no:cacheprovider -rs \
    -k "cuda" "$root/tests/python/test_torch_plugin.py" || failed=1
  PYTHONPATH=$build/python "$build/bin/psrt-run" --local=2 \
    --distribution='{"parameter_server": {"enabled": true, "compression": "fp16"}}' -- \
    "$python" "$root/examples/torch_digits.py" || failed=1  # on cuda:local_rank
else
  echo "skipped: $python has no torch with CUDA (run scripts/setup.sh frameworks on a machine with network)"
fi

step "result"
[ $failed -eq 0 ] && echo "gpu_check: all passed" || echo "gpu_check: FAILED (see above)"
exit $failed
