#!/usr/bin/env bash
# The test suite: scaffold's own tests and, through the matrix, every variant's generated tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick subset.
# DeepSpeed's CPU ops go to one cache that every test process reads: for the whole suite, a
# first set-up of .venv compiles them beside its installs (scripts/_venv.sh), and the matrix
# builds whatever is missing there while its first variants run (tests/test_matrix.py).
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
if [ "$#" -eq 0 ]; then
    DEEPSPEED_OPS_LOG="${TMPDIR:-/tmp}/scaffold-deepspeed-ops.log"
fi
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
"$PY" -m ruff check --no-cache .
"$PY" -m ruff format --check --no-cache .
exec "$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@"
