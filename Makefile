# psrt: `make demo` runs the example job, `make test` runs every test.
# Both install what they need first (scripts/setup.sh).
BUILD ?= build
JOBS ?= 2
PYTHON := $(CURDIR)/.venv/bin/python
# 2 servers and 2 workers on this machine, fp16 gradients, a checkpoint at
# the end into BUILD/demo-checkpoints/DEMO.
DEMO_DISTRIBUTION ?= {"parameter_server": {"enabled": true, "mode": "sync", "compression": "fp16", "checkpoint": {"uri": "file://$(CURDIR)/$(BUILD)/demo-checkpoints/$(DEMO)", "keep": 2}}}
# DEMO=torch (default), tensorflow or mxnet: the same task in each framework;
# DEMO=recsys: a click model with embedding tables on the servers (PyTorch);
# DEMO=resnet18, gpt2, bert, dlrm, keras-resnet, gluon-resnet: examples/ real models.
DEMO ?= torch
DEMO_SCRIPT_torch := examples/torch_digits.py
DEMO_SCRIPT_recsys := examples/torch_recsys.py
DEMO_PYTHON_recsys := $(PYTHON)
DEMO_SCRIPT_tensorflow := examples/keras_digits.py
DEMO_SCRIPT_mxnet := examples/gluon_digits.py
DEMO_PYTHON_torch := $(PYTHON)
DEMO_PYTHON_tensorflow := $(PYTHON)
DEMO_PYTHON_mxnet := $(CURDIR)/.venv-mxnet/bin/python
# Real models on synthetic data shaped like their data sets (examples/).
DEMO_SCRIPT_resnet18 := examples/torch_resnet18.py
DEMO_SCRIPT_gpt2 := examples/torch_gpt2.py
DEMO_SCRIPT_bert := examples/torch_bert_finetune.py
DEMO_SCRIPT_dlrm := examples/torch_dlrm.py
DEMO_SCRIPT_keras-resnet := examples/keras_resnet.py
DEMO_SCRIPT_gluon-resnet := examples/gluon_resnet.py
DEMO_PYTHON_resnet18 := $(PYTHON)
DEMO_PYTHON_gpt2 := $(PYTHON)
DEMO_PYTHON_bert := $(PYTHON)
DEMO_PYTHON_dlrm := $(PYTHON)
DEMO_PYTHON_keras-resnet := $(PYTHON)
DEMO_PYTHON_gluon-resnet := $(CURDIR)/.venv-mxnet/bin/python

.PHONY: all setup configure build wheel test unit-test demo bench fuzz asan tsan bazel image-check clean

all: build

# Debian packages; .venv with torch, tensorflow and pybind11; .venv-mxnet
# (scripts/setup.sh).
setup:
	@scripts/setup.sh frameworks

# Also builds the Python package in place (BUILD/python/psrt) against .venv.
configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPSRT_PYTHON=ON \
	  -DPython_EXECUTABLE=$(PYTHON) -Dpybind11_DIR=$$($(PYTHON) -m pybind11 --cmakedir) \
	  -DPSRT_MXNET_PYTHON=$(CURDIR)/.venv-mxnet/bin/python >/dev/null

build: configure
	@ninja -C $(BUILD) -j$(JOBS) --quiet
	@test -x $(BUILD)/bin/psrt-run

# The wheel first: its test (tests/python/test_wheel.py) then only checks
# that it is up to date.
test: wheel
	@scripts/setup.sh s3
	@cd $(BUILD) && ctest --output-on-failure --no-tests=error -j$(JOBS) --timeout 300
	@FUZZ_BUILD=$(CURDIR)/$(BUILD)/fuzz scripts/fuzz.sh 5

# A manylinux wheel in BUILD/dist that carries the shared libraries it needs
# (scripts/wheel.sh), made of what `make build` compiled.
wheel: build
	@JOBS=$(JOBS) scripts/wheel.sh $(BUILD)

# Every fuzz target (tests/fuzz) for FUZZ_SECONDS, with clang 16, ASan and
# UBSan, in BUILD/fuzz; findings in BUILD/fuzz/findings.
FUZZ_SECONDS ?= 600
fuzz:
	@FUZZ_BUILD=$(CURDIR)/$(BUILD)/fuzz scripts/fuzz.sh $(FUZZ_SECONDS)

# The C++ unit and integration tests built with ASan + UBSan (BUILD/address),
# and the store, client and coordinator tests with TSan (BUILD/thread).
asan:
	@scripts/sanitize.sh address $(BUILD)
tsan:
	@scripts/sanitize.sh thread $(BUILD)

# PyTorch (or DEMO=tensorflow, DEMO=mxnet) trains scikit-learn's handwritten
# digits through 2 servers.
demo: build
	@test -n "$(DEMO_SCRIPT_$(DEMO))" || { echo "make demo: DEMO is torch, tensorflow, mxnet, recsys, resnet18, gpt2, bert, dlrm, keras-resnet or gluon-resnet"; exit 2; }
	@rm -rf $(BUILD)/demo-checkpoints/$(DEMO)
	@PYTHONPATH=$(CURDIR)/$(BUILD)/python $(BUILD)/bin/psrt-run --local=2 \
	  --distribution='$(DEMO_DISTRIBUTION)' -- $(DEMO_PYTHON_$(DEMO)) $(DEMO_SCRIPT_$(DEMO))

bench: build
	@scripts/bench.sh $(BUILD)

# The optional Bazel build (BUILD.bazel), offline against the same Debian
# packages; installs bazel-bootstrap first.
bazel: ; @scripts/setup.sh bazel && scripts/bazel_check.sh

# Builds deploy/docker/Dockerfile with buildah and trains the demo in the
# image, plainly and as SageMaker runs it (scripts/image_check.sh; root).
image-check:
	@scripts/image_check.sh

clean:
	rm -rf $(BUILD)
