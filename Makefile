# psrt: `make demo` runs the example job, `make test` runs every test.
# Both install what they need first (scripts/setup.sh).
BUILD ?= build
JOBS ?= 2
DEMO_DISTRIBUTION ?= {"parameter_server": {"enabled": true, "mode": "sync", "servers_per_host": 1, "workers_per_host": 1}}

.PHONY: all setup configure build test unit-test demo bench bazel clean

all: build

setup:
	@scripts/setup.sh

$(BUILD)/build.ninja: CMakeLists.txt | setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

configure: $(BUILD)/build.ninja

build: setup configure
	@ninja -C $(BUILD) -j$(JOBS) --quiet
	@test -x $(BUILD)/bin/psrt-run

test: build
	@scripts/setup.sh s3
	@cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 300

demo: build
	$(BUILD)/bin/psrt-run --local=2 --distribution='$(DEMO_DISTRIBUTION)' -- \
	  $(BUILD)/bin/psrt-example-linreg --dim=256 --steps=300

bench: build
	@scripts/bench.sh $(BUILD)

# The optional Bazel build (BUILD.bazel), offline against the same Debian
# packages; installs bazel-bootstrap first.
bazel: ; @scripts/setup.sh bazel && scripts/bazel_check.sh

clean:
	rm -rf $(BUILD)
