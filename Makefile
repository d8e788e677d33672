# psrt: `make demo` runs the example job, `make test` runs every test.
# Both install what they need first (scripts/setup.sh).
BUILD ?= build
JOBS ?= 2
PYTHON := $(CURDIR)/.venv/bin/python
# 2 servers and 2 workers on this machine, fp16 gradients, a checkpoint at
# the end into BUILD/demo-checkpoints.
DEMO_DISTRIBUTION ?= {"parameter_server": {"enabled": true, "mode": "sync", "compression": "fp16", "checkpoint": {"uri": "file://$(CURDIR)/$(BUILD)/demo-checkpoints", "keep": 2}}}
DEMO_SCRIPT ?= worker/examples/torch_digits.py

.PHONY: all setup configure build test unit-test demo bench bazel clean

all: build

# Debian packages, and .venv with torch and pybind11 (scripts/setup.sh).
setup:
	@scripts/setup.sh torch

# Also builds the Python package in place (BUILD/python/psrt) against .venv.
configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSRT_PYTHON=ON \
	  -DPython_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$$($(PYTHON) -m pybind11 --cmakedir) >/dev/null

build: configure
	@ninja -C $(BUILD) -j$(JOBS) --quiet
	@test -x $(BUILD)/bin/psrt-run

test: build
	@scripts/setup.sh s3
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 300

# PyTorch trains scikit-learn's handwritten digits through 2 servers.
demo: build
	@PYTHONPATH=$(CURDIR)/$(BUILD)/python $(BUILD)/bin/psrt-run --local=2 \
	  --distribution='$(DEMO_DISTRIBUTION)' -- $(PYTHON) $(DEMO_SCRIPT)

bench: build
	@scripts/bench.sh $(BUILD)

# The optional Bazel build (BUILD.bazel), offline against the same Debian
# packages; installs bazel-bootstrap first.
bazel: ; @scripts/setup.sh bazel && scripts/bazel_check.sh

clean:
	rm -rf $(BUILD)
