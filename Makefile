# mxserve front door. `make run` and `make test` work on a fresh Debian 12 machine.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
# Keep nested makes (cmake --build) from printing "Entering directory" lines.
MAKEFLAGS += --no-print-directory

.PHONY: all deps configure build test run observe up down bench bench-overhead bench-hot-path \
        experiment gpu-bundle cpu-bundle \
        format clean \
        test-asan test-tsan fuzz check-minimal-build

# Sanitizer builds: clang, each in its own tree, without the benchmarks and the
# Python client (neither is what they check).
ASAN_DIR ?= build-asan
TSAN_DIR ?= build-tsan
SANITIZER_CMAKE = -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
                  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMXSERVE_BUILD_BENCH=OFF \
                  -DMXSERVE_BUILD_PYTHON=OFF
# Seconds `make fuzz` gives each fuzz target, and its corpus (kept between runs).
FUZZ_SECONDS ?= 60

all: build

deps:
	@bash scripts/deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) >/dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	@cd $(BUILD_DIR) && ctest --output-on-failure -j$(JOBS)

# mxserved and mxctl built with only gRPC, protobuf, Abseil, prometheus-cpp and
# nlohmann-json visible (tests, benchmarks, Python client off; the rest hidden), in
# a scratch tree that is removed afterwards.
check-minimal-build: deps
	@JOBS=$(JOBS) bash scripts/check_minimal_build.sh

# The daemon in the foreground: CPU emulation, policy D, metrics. Ctrl-C stops it.
# MXSERVED_FLAGS adds flags, e.g. MXSERVED_FLAGS="--workers 4 --batch-window-us 500".
# MODEL_DIR is where Models.LoadSafetensors may read files (created if missing).
MODEL_DIR ?= models
run: build
	@mkdir -p $(MODEL_DIR)
	@echo "mxserved: gRPC on 127.0.0.1:50051, metrics on http://127.0.0.1:9464/metrics;" \
	      "safetensors load from $(MODEL_DIR)/; try build/bin/mxctl health in another" \
	      "terminal. Ctrl-C stops it."
	@exec $(BUILD_DIR)/bin/mxserved --backend cpu --default-policy D-phase-adaptive \
	      --listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464 \
	      --model-dir $(MODEL_DIR) $(MXSERVED_FLAGS)

# mxserved and Debian's Prometheus natively, with deploy/prometheus's config and
# rules (no Docker needed); prints where to look. Ctrl-C stops both.
observe: build
	@BUILD_DIR=$(abspath $(BUILD_DIR)) bash scripts/observe.sh

# The compose stack of docker/compose.yaml, built from this checkout: mxserved
# (cpu backend, policy D), Prometheus and Grafana, published on 127.0.0.1 only
# (gRPC 50051, metrics 9464, Prometheus 9090, Grafana 3000). `docker compose`
# (v2) or else docker-compose (v1). COMPOSE_FLAGS goes before the command, e.g.
# COMPOSE_FLAGS="--profile gpu" for the GPU baseline runner. `make down` keeps
# the volumes (policies, Prometheus and Grafana data); add -v by hand to drop them.
COMPOSE_FLAGS ?=
COMPOSE = $(shell if docker compose version >/dev/null 2>&1; then echo "docker compose"; \
                  elif command -v docker-compose >/dev/null 2>&1; then echo docker-compose; fi)
NO_COMPOSE = no Docker here: use `make observe` for the native stack (neither `docker compose` nor docker-compose was found)
up:
	@$(if $(COMPOSE),,echo 'make up: $(NO_COMPOSE)' >&2; exit 1)
	@$(COMPOSE) -p mxserve -f docker/compose.yaml $(COMPOSE_FLAGS) up -d --build
	@echo "mxserve: gRPC 127.0.0.1:50051, metrics http://127.0.0.1:9464/metrics," \
	      "Prometheus http://127.0.0.1:9090, Grafana http://127.0.0.1:3000; make down stops it."

down:
	@$(if $(COMPOSE),,echo 'make down: $(NO_COMPOSE)' >&2; exit 1)
	@$(COMPOSE) -p mxserve -f docker/compose.yaml $(COMPOSE_FLAGS) down

bench: build
	@$(BUILD_DIR)/bin/mx_bench

# The quick experiment: a daemon in emulation mode and PPO-RLHF over the whole
# policy matrix on the built-in model; report.md, results.csv and the plots land in
# EXPERIMENT_OUT. EXPERIMENT_ARGS replaces --quick (e.g. "--config my.toml").
EXPERIMENT_OUT ?= $(BUILD_DIR)/experiment
experiment: build
	@BUILD_DIR=$(abspath $(BUILD_DIR)) EXPERIMENT_OUT=$(abspath $(EXPERIMENT_OUT)) \
	    bash scripts/experiment.sh

# mxserved (null backend) against a bare gRPC server: p50 and throughput ratios.
bench-overhead: build
	@BUILD_DIR=$(abspath $(BUILD_DIR)) bash bench/overhead.sh

# The trainer's hot path on a Qwen2.5-0.5B-shaped model (issue 20): decode step,
# per-call overhead, sync_weights and a PPO update step against their targets, in
# one run (about 7 minutes on 2 cores; its own daemons). HOT_PATH_ARGS adds flags, e.g.
# HOT_PATH_ARGS="--scale small" for a quick run, "--json hot_path.json".
HOT_PATH_ARGS ?=
bench-hot-path: build
	@MXSERVED=$(abspath $(BUILD_DIR))/bin/mxserved /usr/bin/python3 bench/hot_path.py $(HOT_PATH_ARGS)

# AddressSanitizer + UndefinedBehaviorSanitizer over the unit, daemon and
# fuzz tests (the fuzz targets run under libFuzzer for a few seconds each).
test-asan: deps
	@cmake -S . -B $(ASAN_DIR) $(SANITIZER_CMAKE) -DMXSERVE_SANITIZE=address,undefined \
	       -DMXSERVE_FUZZ=ON >/dev/null
	@cmake --build $(ASAN_DIR) -j$(JOBS)
	@cd $(ASAN_DIR) && ASAN_OPTIONS=detect_leaks=1:strict_string_checks=1 \
	    UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$(JOBS)

# ThreadSanitizer over the daemon's shared state without gRPC in between: every
# server_<room>_tests binary (label server_unit), i.e. the scheduler (queue, batching,
# deadlines, shutdown) and the registry, copy cache, memory budget and energy
# ledger under many threads, and the daemon's other parts without a daemon.
# The gRPC reactors are not among them: Debian's gRPC is not built with TSan, and a TSan daemon reports
# gRPC's own inline code (std::function, reference counts) handing its objects
# between threads by the hundred (see tests/tsan.supp).
test-tsan: deps
	@cmake -S . -B $(TSAN_DIR) $(SANITIZER_CMAKE) -DMXSERVE_SANITIZE=thread >/dev/null
	@cmake --build $(TSAN_DIR) -j$(JOBS) --target server_tests
	@{ cat tests/tsan.supp; for t in $(TSAN_DIR)/bin/server_*_tests; do ldd $$t; done | \
	   awk '$$1 ~ /^lib(absl_|grpc|gpr|protobuf|upb|re2|cares|address_sorting|ssl|crypto)/ \
	        {print "called_from_lib:" $$1}' | sort -u; } > $(TSAN_DIR)/tsan.supp
	@cd $(TSAN_DIR) && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 \
	    suppressions=$(abspath $(TSAN_DIR))/tsan.supp" ctest --output-on-failure -j$(JOBS) \
	    -L server_unit

# Each fuzz target under libFuzzer (ASan + UBSan) for FUZZ_SECONDS; new inputs
# are kept in $(ASAN_DIR)/tests/fuzz/corpus/<target>, crashes in .../work/<target>.
fuzz: deps
	@cmake -S . -B $(ASAN_DIR) $(SANITIZER_CMAKE) -DMXSERVE_SANITIZE=address,undefined \
	       -DMXSERVE_FUZZ=ON >/dev/null
	@cmake --build $(ASAN_DIR) -j$(JOBS) --target fuzz_rpc fuzz_energy fuzz_work fuzz_safetensors fuzz_policy \
	       fuzz_operands fuzz_auth_tokens fuzz_seeds
	@for t in rpc energy work safetensors policy operands auth_tokens; do \
	  echo "fuzz_$$t: $(FUZZ_SECONDS) s"; \
	  ( cd $(ASAN_DIR)/tests/fuzz/work/$$t && ../../../../bin/fuzz_$$t \
	      -max_total_time=$(FUZZ_SECONDS) -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	      ../../corpus/$$t ../../seeds/$$t ) || exit 1; \
	done

format:
	@git ls-files '*.h' '*.cc' | xargs clang-format -i

clean:
	@rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR) build-minimal.*

# $(call bundle,DIR,BINARIES): BINARIES from $(BUILD_DIR)/bin in $(BUILD_DIR)/DIR
# with the dynamic loader and every library they link in DIR/lib, for hosts
# without Debian's packages (a missing binary fails the recipe).
define bundle
	@rm -rf $(BUILD_DIR)/$(1) && mkdir -p $(BUILD_DIR)/$(1)/lib
	@for b in $(2); do cp $(BUILD_DIR)/bin/$$b $(BUILD_DIR)/$(1)/ || exit 1; done
	@for b in $(2); do \
	  ldd $(BUILD_DIR)/bin/$$b | awk '/=>/ {print $$3} /ld-linux/ {print $$1}'; done | \
	  sort -u | xargs -I{} cp -L {} $(BUILD_DIR)/$(1)/lib/
endef

# mxserved (build/gpu-bundle), for bench/gpu_check.sh on a GPU host.
gpu-bundle: build
	$(call bundle,gpu-bundle,mxserved)
	@du -sh $(BUILD_DIR)/gpu-bundle

# mx_bench, amx_probe and the numerics/kernel tests with the dynamic loader and every
# library they link, xz-packed (build/cpu-bundle.tar.xz, about 15 MB), for
# bench/cpu_check.sh on a borrowed machine without Debian's packages (an AMX Xeon).
CPU_BUNDLE_BINARIES = mx_bench amx_probe mx_tests mx_kernels_tests mx_emulated_levels_tests
cpu-bundle: build
	$(call bundle,cpu-bundle,$(CPU_BUNDLE_BINARIES))
	@cp -r ../shared/golden/mx $(BUILD_DIR)/cpu-bundle/golden
	@tar -C $(BUILD_DIR) -cJf $(BUILD_DIR)/cpu-bundle.tar.xz cpu-bundle
	@du -sh $(BUILD_DIR)/cpu-bundle.tar.xz
