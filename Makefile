# Starling: the two commands are `make demo` and `make test` (see README.md).
# Everything installs what is missing first (scripts/install-deps.sh, apt-get, needs root).
BUILD   := build
JOBS    ?= $(shell nproc)
CTEST_J ?= 2

.PHONY: all deps configure build test test-all demo fuzz clean format
all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: CMakeLists.txt CMakePresets.json | deps
	cmake --preset release

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The whole suite except soak tests (those run with `make test-all`).
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(CTEST_J) -LE soak

test-all: build
	cd $(BUILD) && ctest --output-on-failure -j $(CTEST_J)

# The demo needs only the CLI (`starling`, which builds `starling-train`), not the test suite.
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target starling_cli
	scripts/demo.sh $(BUILD)

# make bench-transport, bench-dht, bench-allreduce, bench-training, ...
bench-%: build
	bench/run-$*.sh $(BUILD)

fuzz: deps
	cmake --preset fuzz && cmake --build $(BUILD)/fuzz -j $(JOBS)

format:
	find include src tests tools bench fuzz examples -name '*.[ch]pp' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-dev build-clang
