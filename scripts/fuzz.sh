#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz; clang 16 with ASan + UBSan) in
# BUILD_DIR and runs each for SECONDS from its seed corpus, keeping what it
# finds to grow the corpus across runs (BUILD_DIR/corpus/<target>) and any
# crash, leak, timeout or undefined behaviour as BUILD_DIR/findings/<target>-*.
# Prints executions, corpus and findings per target; exits 1 on a finding.
#
#   scripts/fuzz.sh SECONDS [TARGET...]     (`make fuzz`; `make test` runs 5 s each)
set -euo pipefail

if [ $# -lt 1 ]; then
  echo "usage: $0 SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD:-$root/build/fuzz}
"$root/scripts/setup.sh" fuzz
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-16 \
  -DPSRT_SANITIZE=fuzzer -DPSRT_PYTHON=OFF -DPSRT_ENABLE_CUDA=OFF >/dev/null
ninja -C "$build" -j"${JOBS:-2}" --quiet fuzz

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=(store service coordinator wire shard manifest config s3)
fi
mkdir -p "$build/findings"
export ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-16/bin/llvm-symbolizer UBSAN_OPTIONS=print_stacktrace=1
failed=0
printf '%-12s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus result
for t in "${targets[@]}"; do
  corpus=$build/corpus/$t
  mkdir -p "$corpus"
  log=$build/findings/$t.log
  set +e
  # -timeout: one input past 10 s is a hang; -rss_limit_mb: a runaway allocation.
  "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix="$build/findings/$t-" "$corpus" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  units=$(find "$corpus" -type f | wc -l)
  if [ $rc -eq 0 ]; then
    result=ok
  else
    failed=1
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)
    result="FOUND (exit $rc): ${artifact:-see $log}"
    grep -m1 -E "ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|==ERROR" "$log" | sed 's/^/    /' || true
  fi
  printf '%-12s %8s %12s %10s %8s  %s\n' "$t" "$seconds" "${execs:-0}" "${rate:-0}" "$units" "$result"
done
exit $failed
