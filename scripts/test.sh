#!/usr/bin/env bash
# The test suite: scaffold's own tests and, through the matrix, every variant's generated tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick subset.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
"$PY" -m ruff check --no-cache .
"$PY" -m ruff format --check --no-cache .
# DeepSpeed's CPU ops go to one cache that every test process reads (the matrix builds them
# there while its first variants run, tests/test_matrix.py).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
exec "$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@"
