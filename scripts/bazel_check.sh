#!/usr/bin/env bash
# Builds everything with Bazel (//...) and runs the unit tests under
# `bazel test`, then prints one summary line computed from the test results:
#
#   bazel: N passed, N failed
#
# N counts GoogleTest cases from each test target's test.xml; a build that
# fails, or a test target that dies without reporting its cases, counts as one
# failure. Exits non-zero when anything failed.
#
# Environment:
#   BAZEL             the bazel binary (default: bazel, i.e. Debian's bazel-bootstrap)
#   PSRT_BAZEL_ROOT   Bazel's output user root (default: ~/.cache/psrt-bazel)
#   BAZEL_JOBS        parallel jobs (default: 1; the machine is shared)
#   BAZEL_TESTS       test targets to run (default: //:unit_tests)
set -uo pipefail
cd "$(dirname "$0")/.."

bazel_bin=${BAZEL:-bazel}
root=${PSRT_BAZEL_ROOT:-$HOME/.cache/psrt-bazel}
jobs=${BAZEL_JOBS:-1}
read -r -a tests <<<"${BAZEL_TESTS:-//:unit_tests}"

if ! command -v "$bazel_bin" >/dev/null 2>&1; then
  echo "bazel_check: $bazel_bin not found; run scripts/setup.sh bazel" >&2
  echo "bazel: 0 passed, 1 failed"
  exit 1
fi

# Startup options: the output tree outside the repository, no per-user rc,
# and a server that goes away after 10 idle minutes (the machine is shared).
startup=(--output_user_root="$root" --nohome_rc --max_idle_secs=600)
opts=(--jobs="$jobs" --local_cpu_resources="$jobs" --local_test_jobs="$jobs")

passed=0
failed=0
skipped=0

build_rc=0
"$bazel_bin" "${startup[@]}" build "${opts[@]}" -- //... || build_rc=$?
if [ "$build_rc" -ne 0 ]; then
  echo "bazel_check: bazel build //... failed (exit $build_rc)" >&2
  failed=$((failed + 1))
fi

test_rc=0
"$bazel_bin" "${startup[@]}" test "${opts[@]}" -- "${tests[@]}" || test_rc=$?

# Exit 0: all passed; 3: some tests failed. Anything else means the tests did
# not (all) run, and any test.xml there may be stale.
if [ "$test_rc" -eq 0 ] || [ "$test_rc" -eq 3 ]; then
  testlogs=$("$bazel_bin" "${startup[@]}" info "${opts[@]}" bazel-testlogs 2>/dev/null)
  for t in "${tests[@]}"; do
    # //pkg:name -> <testlogs>/pkg/name/test.xml
    rel=${t#//}
    rel=${rel/://}
    rel=${rel#/}
    xml="$testlogs/$rel/test.xml"
    if [ ! -f "$xml" ]; then
      echo "bazel_check: no $xml for $t" >&2
      failed=$((failed + 1))
      continue
    fi
    # One <testcase> per case; a <failure> or <error> inside marks it failed
    # (Bazel writes an <error> case itself when the binary dies), and
    # result="skipped" (GTEST_SKIP) marks it skipped.
    read -r p f s < <(awk '
      function close_case() {
        if (!open) return
        if (bad) f++; else if (skip) s++; else p++
        open = 0
      }
      {
        line = $0
        while (match(line, /<testcase[ >]|<failure|<error|<\/testcase>/)) {
          tok = substr(line, RSTART, RLENGTH)
          rest = substr(line, RSTART + RLENGTH)
          if (tok ~ /^<testcase/) {
            close_case(); open = 1; bad = 0; skip = 0
            head = rest; sub(/>.*/, "", head)
            if (head ~ /result="skipped"/) skip = 1
            if (head ~ /\/$/) close_case()  # <testcase ... />
          } else if (tok ~ /^<failure|^<error/) {
            if (open) bad = 1
          } else if (tok == "</testcase>") {
            close_case()
          }
          line = rest
        }
      }
      END { close_case(); printf "%d %d %d\n", p, f, s }' "$xml")
    passed=$((passed + p))
    failed=$((failed + f))
    skipped=$((skipped + s))
  done
  if [ "$test_rc" -eq 3 ] && [ "$failed" -eq 0 ]; then
    # Bazel says a test failed though no case did (e.g. a timeout).
    failed=1
  fi
else
  echo "bazel_check: bazel test failed (exit $test_rc)" >&2
  failed=$((failed + ${#tests[@]}))
fi

[ "$skipped" -eq 0 ] || echo "bazel_check: $skipped skipped"
echo "bazel: $passed passed, $failed failed"
[ "$build_rc" -eq 0 ] && [ "$test_rc" -eq 0 ] && [ "$failed" -eq 0 ]
