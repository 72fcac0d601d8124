# The README's commands. Each installs what is missing first (scripts/bootstrap, idempotent).
BUILD_DIR ?= build
GENERATOR ?= Ninja
CMAKE_FLAGS ?=
LISTEN ?= 127.0.0.1:9090
DATA_DIR ?= $(CURDIR)/.agentbox

.PHONY: all bootstrap configure build run test test-security test-asan test-sanitized bench package fuzz clean format

all: build

bootstrap:
	@scripts/bootstrap

configure: bootstrap
	@cmake -S . -B $(BUILD_DIR) -G $(GENERATOR) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $$(nproc)

run: build
	@scripts/run "$(BUILD_DIR)/bin/agentboxd" --listen $(LISTEN) --data-dir $(DATA_DIR) $(ARGS)

test: build
	@scripts/test $(BUILD_DIR)

# Only the escape suite of shared/SECURITY.md against real ns boxes (root); `make test` runs it too.
test-security: build
	@cd $(BUILD_DIR) && ctest -L security --output-on-failure

# The same tests under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan:
	@$(MAKE) test BUILD_DIR=build-asan CMAKE_FLAGS="-DAGENTBOX_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug"

# CI's sanitizer run (scripts/test-sanitized): the subset of the tests that covers every surface,
# under ASan + LSan + UBSan, building only what it runs (in build-asan).
test-sanitized: bootstrap
	@scripts/test-sanitized build-asan

# agentbox_<version>_<arch>.deb in $(BUILD_DIR)/package (cmake/Packaging.cmake, deploy/debian).
package: build
	@cd $(BUILD_DIR) && cpack -G DEB -B $(CURDIR)/$(BUILD_DIR)/package >/dev/null && ls -1 $(CURDIR)/$(BUILD_DIR)/package/*.deb

# The libFuzzer harnesses of tests/fuzz (clang, ASan + UBSan, in build-fuzz), each for
# FUZZ_SECONDS (default 60); crashes land in tests/fuzz/crashes/.
FUZZ_SECONDS ?= 60
fuzz: bootstrap
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz

# SECTION=images: only that group (scripts/bench --section).
bench: build
	@scripts/bench $(BUILD_DIR) $(if $(SECTION),--section $(SECTION))

format:
	@clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD_DIR) build-asan build-fuzz
