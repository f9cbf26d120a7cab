# The two set-up commands are `make demo` and `make test`; both install what
# is missing first (scripts/setup.sh) and are safe to run again.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-all test-cluster lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(BIN)/shinglefs demo

test: setup
	@bash scripts/test.sh -m "not slow"

test-all: setup
	@bash scripts/test.sh

# Every multi-host test (test hosts as network namespaces, tests/cluster);
# `make test` runs a representative one (the others are marked slow). Needs CAP_NET_ADMIN + CAP_SYS_ADMIN (root).
test-cluster: setup
	$(BIN)/python -m pytest tests/cluster

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy src/shinglefs

# Every benchmark writes its JSON to bench-data/NAME.json, then the report is
# written from those files alone (docs/benchmarks.md, plots in docs/img/).
# BENCH_FLAGS=--quick runs the small sizes.
BENCHMARKS = $(shell $(BIN)/python -c "from shinglefs.bench import BENCHMARKS; print(*BENCHMARKS)" 2>/dev/null)
BENCH_FLAGS ?=

bench: setup
	@mkdir -p bench-data
	@set -e; for b in $(BENCHMARKS); do \
		echo "== shinglefs bench $$b $(BENCH_FLAGS)"; \
		$(BIN)/shinglefs bench $$b --json $(BENCH_FLAGS) > bench-data/$$b.json; \
	done
	$(BIN)/shinglefs bench report $(foreach b,$(BENCHMARKS),bench-data/$(b).json) \
		--out docs/benchmarks.md --img docs/img

clean:
	rm -rf $(VENV) demo-data bench-data .pytest_cache .hypothesis
