# streamrank: every target installs what it needs; see README.md.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STREAMRANK := $(VENV)/bin/streamrank
STACK_DIR ?= .stack
DEMO_EVENTS ?= 5000

.PHONY: install stack-up stack-down demo test test-fast test-unit test-compat test-faults compose-check lint typecheck check bench soak clean

install:
	@scripts/install.sh

# SECURE=1: Kafka SASL_SSL (SCRAM-SHA-512) + TLS, Redis TLS + password (scripts/stack_tls.sh).
stack-up:
	@scripts/stack_up.sh $(if $(filter 1,$(SECURE)),--secure) $(STACK_DIR)

stack-down:
	@scripts/stack_down.sh $(STACK_DIR)

demo: install stack-up
	@DEMO_EVENTS=$(DEMO_EVENTS) STACK_DIR=$(STACK_DIR) scripts/demo.sh

# The tests start their own Kafka and Redis (session fixtures calling scripts/stack_up.sh).
# test: the whole suite (what CI runs, .ci/run); test-fast: without the slow tests (the end to
# end and multi-rank integration tests, the long model tests); test-unit: no servers at all.
# The suite runs on TEST_WORKERS pytest-xdist workers (0: in this process), each with its own
# Kafka and Redis (tests/conftest.py); files are handed out whole, the longest first.
# Three on our two cores: a third of the suite's time is spent waiting (broker restarts,
# session timeouts, idle timers), so two workers left the CPU 27% idle (24 min against 19).
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadfile
# The model code on the GPU machine's versions (torch 2.11, TorchRec 1.6.1, FBGEMM 1.6.0) in
# .venv-compat, next to our pins (torch 2.13, TorchRec 1.8.0) in .venv.
COMPAT_TESTS := tests/model tests/pipeline/stages/test_score.py tests/pipeline/runtime/test_loop.py \
	tests/scripts/test_gpu_check.py \
	tests/scripts/gpucheck
# test: the two venvs and the Debian tools built side by side, then the suite, then test-compat
# (scripts/test.sh).
test:
	@scripts/test.sh $(XDIST)

test-compat:
	@scripts/install_compat.sh
	@.venv-compat/bin/python -m pytest -q $(XDIST) $(COMPAT_TESTS)

test-fast: install
	@$(PY) -m pytest -q $(XDIST) tests -m "not slow"

test-unit: install
	@$(PY) -m pytest -q $(XDIST) tests -m "not integration"

# The fault suite (tests/faults) alone; -s prints the numbers recorded in RELIABILITY.md.
test-faults: install
	@$(PY) -m pytest -q -s tests/faults

# The docker compose stack brought up on a real Docker engine and audited (docs/compose.md):
# images without a registry (local stand-ins), 2 scorer replicas, the rollout, a replica
# killed, Prometheus, `down -v`. As root (or sudo); starts and stops its own dockerd when none
# answers. Not part of `test` (no Docker needed there); no venv needed.
compose-check:
	@scripts/compose_check.sh

lint: install
	@$(VENV)/bin/ruff check pipeline model tests scripts
	@$(VENV)/bin/ruff format --check pipeline model tests scripts

typecheck: install
	@$(VENV)/bin/mypy

check: lint typecheck test

bench: install stack-up
	@source $(STACK_DIR)/env && $(STREAMRANK) bench model && $(STREAMRANK) bench pipeline

# The soak (streamrank bench soak): 10 minutes at half of the measured capacity on the local
# stack, RSS / consumer lag / p99 sampled every 30 s; artifacts/soak/soak.json and soak.png.
# Trains the model first when there is none. SOAK_ARGS="--minutes 2" and so on.
SOAK_ARGS ?=
soak: install stack-up
	@source $(STACK_DIR)/env && \
		export STREAMRANK_MODEL__CHECKPOINT="$${STREAMRANK_MODEL__CHECKPOINT:-artifacts/model}" && \
		{ [[ -f "$$STREAMRANK_MODEL__CHECKPOINT/meta.json" ]] || $(STREAMRANK) init-model; } && \
		$(STREAMRANK) bench soak --out artifacts/soak $(SOAK_ARGS)

clean: stack-down
	rm -rf $(VENV) .venv-compat artifacts .pytest_cache .mypy_cache .ruff_cache
