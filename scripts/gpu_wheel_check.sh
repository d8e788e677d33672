#!/usr/bin/env bash
# The PyTorch plugin's CUDA tests on a machine with a GPU and torch but no
# build tools for psrt's C++: the daemons and libpsrt_c come from the wheel
# (`make wheel`, BUILD/dist), the Python extension is compiled there against
# that interpreter (pybind11 from torch's headers).
# (scripts/gpu_check.sh builds everything on a machine that has the tools.)
# Usage: scripts/gpu_wheel_check.sh WHEEL
set -euo pipefail
wheel=$1
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
work=$(mktemp -d)
python3 -m zipfile -e "$wheel" "$work"
cp -r "$root/python/psrt/." "$work/psrt/"
torch_include=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
ext=$(python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
g++ -O2 -shared -fPIC -std=c++17 "$root/python/psrt/_psrt.cc" -I"$root" -I"$torch_include" \
  -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
  -L"$work/psrt" -l:libpsrt_c.so -Wl,-rpath,'$ORIGIN' -o "$work/psrt/_psrt$ext"
chmod +x "$work"/psrt.scripts/*
export PYTHONPATH=$work PSRT_BIN_DIR=$work/psrt.scripts
nvidia-smi -L
cd "$root/tests/python"
python3 -m pytest -q -p no:cacheprovider -rs -k "cuda" test_torch_models.py test_torch_plugin.py
