#!/usr/bin/env bash
# The test suite: scaffold's own tests and, through the matrix, every variant's generated tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick subset.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
"$PY" -m ruff check --no-cache .
"$PY" -m ruff format --check --no-cache .
# DeepSpeed's CPU ops, compiled once into the cache every test process reads.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
"$PY" scripts/build_deepspeed_ops.py
exec "$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@"
