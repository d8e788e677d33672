#!/usr/bin/env bash
# Builds psrt with a sanitizer in BUILD_DIR/<mode> and runs its C++ tests
# there (the daemons the integration tests start are instrumented too).
#
#   scripts/sanitize.sh address BUILD_DIR   (`make asan`: ASan + UBSan, every C++ test)
#   scripts/sanitize.sh thread BUILD_DIR    (`make tsan`: TSan, the store, client and coordinator tests)
#
# TSan must see Abseil's mutexes, which Debian's libabsl is not built to
# show it: `thread` first builds Debian's own Abseil source package with TSan
# (once, into BUILD_DIR/thread-absl, same version and ABI) and runs every
# process against it, gRPC included. Extra ctest arguments may follow.
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 address|thread BUILD_DIR [ctest args...]" >&2
  exit 2
fi
mode=$1
out=$(cd "$2" 2>/dev/null && pwd || { mkdir -p "$2" && cd "$2" && pwd; })
build=$out/$mode
shift 2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
extra=()
case $mode in
  address)
    "$root/scripts/setup.sh" s3
    # Leaks are checked at every process's exit; a finding fails the test.
    export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:exitcode=86
    export LSAN_OPTIONS=suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    select=(-E 'Cuda')
    ;;
  thread)
    "$root/scripts/setup.sh" tsan
    absl=$out/thread-absl
    if [ ! -e "$absl/lib/libabsl_synchronization.so" ]; then
      src=$(mktemp -d)
      echo "sanitize: building Debian's Abseil with TSan into $absl"
      (cd "$src" && apt-get source -qq --download-only abseil >/dev/null 2>&1 &&
        dpkg-source -x abseil_*.dsc abseil >/dev/null)
      cmake -S "$src/abseil" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
        -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS="-fsanitize=thread -fno-omit-frame-pointer" \
        -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DCMAKE_INSTALL_PREFIX="$absl" >/dev/null
      ninja -C "$src/build" -j"${JOBS:-2}" --quiet install >/dev/null
      rm -rf "$src"
    fi
    extra=(-DCMAKE_PREFIX_PATH="$absl")
    export LD_LIBRARY_PATH=$absl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export TSAN_OPTIONS=suppressions=$root/tests/sanitizers/tsan.supp:halt_on_error=1:exitcode=66:second_deadlock_stack=1
    select=(-R '^(StoreTest|BadInputTest|TableTest|DataPathTest|ConsistencyTest|CApiTest|JobTest)\.')
    ;;
  *)
    echo "$0: mode is address or thread" >&2
    exit 2
    ;;
esac
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSRT_SANITIZE="$mode" \
  -DPSRT_PYTHON=OFF -DPSRT_ENABLE_CUDA=OFF "${extra[@]}" >/dev/null
ninja -C "$build" -j"${JOBS:-2}" --quiet
cd "$build"
ctest --output-on-failure -j"${JOBS:-2}" --timeout 600 "${select[@]}" "$@"
