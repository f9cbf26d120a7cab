#!/usr/bin/env bash
# Runs the test suite: ruff and mypy (all of src), then pytest. The PostgreSQL cluster the metadata
# tests need is started and stopped by the test session itself
# (tests/support/pgcluster.py); if it cannot start, the tests fail loudly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/ruff check src tests
$BIN/mypy src/shinglefs
# The slowest tests are listed at the end: the suite is kept well under 20 minutes.
exec $BIN/python -m pytest --durations=25 "$@"
