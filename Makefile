# Starling: the two commands are `make demo` and `make test` (see README.md).
# Everything installs what is missing first (scripts/install-deps.sh, apt-get, needs root).
BUILD   := build
JOBS    ?= $(shell nproc)
CTEST_J ?= 2

.PHONY: all deps dev-deps configure build test test-all test-asan test-tsan demo demo-lm demo-moe python-install fuzz clean format tidy
all: build

deps:
	@scripts/install-deps.sh

dev-deps:
	@scripts/install-deps.sh --dev

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

# The unit and multi-node suites under sanitizers (-O1 trees of their own: build-asan, build-tsan).
SAN_LABELS := unit|averaging|dht|training
SAN_SUPP   := $(CURDIR)/tests/sanitizers
test-asan: deps
	cmake --preset asan && cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(SAN_SUPP)/lsan.supp \
	  ctest --output-on-failure -j $(CTEST_J) -L "$(SAN_LABELS)" -LE soak

test-tsan: deps
	cmake --preset tsan && cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$(SAN_SUPP)/tsan.supp" \
	  OMP_NUM_THREADS=1 ctest --output-on-failure -j $(CTEST_J) -L "$(SAN_LABELS)" -LE soak

# The demo needs only the CLI (`starling`, which builds `starling-train`), not the test suite.
demo: configure
	cmake --build $(BUILD) -j $(JOBS) --target starling_cli
	scripts/demo.sh $(BUILD)

# The language-model task on loopback: 4 trainers, one killed, one joining (scripts/demo_lm.sh).
demo-lm: configure
	cmake --build $(BUILD) -j $(JOBS) --target starling_cli
	scripts/demo_lm.sh $(BUILD)

# Decentralized mixture of experts on loopback: 2 expert servers (one killed, one restarted
# from its checkpoints) and 3 trainers (scripts/demo_moe.sh).
demo-moe: configure
	cmake --build $(BUILD) -j $(JOBS) --target starling_cli
	scripts/demo_moe.sh $(BUILD)

# The Python module, built and copied into the python3 that imports torch (docs/python.md).
python-install: configure
	cmake --build $(BUILD) -j $(JOBS) --target python-install

# make bench-transport, bench-dht, bench-allreduce, bench-training, ...
bench-%: build
	bench/run-$*.sh $(BUILD)
bench-nat: build ; bench/run-nat.sh $(BUILD) && bench/run-nat-js.sh $(BUILD)

fuzz: deps
	cmake --preset fuzz && cmake --build $(BUILD)/fuzz -j $(JOBS)

format: dev-deps
	find include src tests tools bench fuzz examples -name '*.[ch]pp' | xargs clang-format -i

# clang-tidy (.clang-tidy's checks) over the library's sources, with the compile commands of
# the clang fuzz tree (every torch-free module but collab).
tidy: dev-deps fuzz
	find src -name '*.cpp' -not -path '*/collab/*' -not -path '*/optim/*' -not -path '*/monitor/web/*' \
	  | xargs -P $(JOBS) -n 8 clang-tidy-16 -p $(BUILD)/fuzz --quiet

clean:
	rm -rf $(BUILD) build-dev build-clang build-asan build-tsan
