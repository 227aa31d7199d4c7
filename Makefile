# mxserve front door. `make run` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2

.PHONY: all deps configure build test run bench bench-overhead format clean

all: build

deps:
	@bash scripts/deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

run: build
	@$(BUILD_DIR)/bin/mxctl demo

bench: build
	@$(BUILD_DIR)/bin/mx_bench

# mxserved (null backend) against a bare gRPC server: p50 and throughput ratios.
bench-overhead: build
	@BUILD_DIR=$(abspath $(BUILD_DIR)) bash bench/overhead.sh

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
