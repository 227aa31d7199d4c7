# mxserve front door. `make run` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
# Keep nested makes (cmake --build) from printing "Entering directory" lines.
MAKEFLAGS += --no-print-directory

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

# The daemon in the foreground: CPU emulation, policy D, metrics. Ctrl-C stops it.
# MXSERVED_FLAGS adds flags, e.g. MXSERVED_FLAGS="--workers 4 --batch-window-us 500".
run: build
	@echo "mxserved: gRPC on 127.0.0.1:50051, metrics on http://127.0.0.1:9464/metrics;" \
	      "try build/bin/mxctl health in another terminal. Ctrl-C stops it."
	@exec $(BUILD_DIR)/bin/mxserved --backend cpu --default-policy D-phase-adaptive \
	      --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464 $(MXSERVED_FLAGS)

bench: build
	@$(BUILD_DIR)/bin/mx_bench

# mxserved (null backend) against a bare gRPC server: p50 and throughput ratios.
bench-overhead: build
	@BUILD_DIR=$(abspath $(BUILD_DIR)) bash bench/overhead.sh

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR)
