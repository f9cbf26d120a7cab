# The two set-up commands are `make demo` and `make test`; both install what
# is missing first (scripts/setup.sh) and are safe to run again.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-all lint bench clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(BIN)/shinglefs demo

test: setup
	@bash scripts/test.sh -m "not slow"

test-all: setup
	@bash scripts/test.sh

lint: setup
	$(BIN)/ruff check src tests
	$(BIN)/mypy src/shinglefs

bench: setup
	@mkdir -p bench-data
	$(BIN)/shinglefs bench all --json --report docs/benchmarks.md > bench-data/bench.json
	$(BIN)/shinglefs sim plots bench-data/bench.json --out docs/img --append-to docs/benchmarks.md

clean:
	rm -rf $(VENV) demo-data bench-data .pytest_cache .hypothesis
