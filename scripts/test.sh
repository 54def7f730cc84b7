#!/usr/bin/env bash
# The test suite: scaffold's own tests and, through the matrix, every variant's generated tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick subset.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
"$PY" -m ruff check --no-cache .
"$PY" -m ruff format --check --no-cache .
# DeepSpeed's CPU ops, compiled once into the cache every test process reads, while the tests
# start: the matrix queues the ZeRO variants after the other multi-process ones, and a process
# that needs an op still being built waits on torch's build lock.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
"$PY" scripts/build_deepspeed_ops.py &
build=$!
status=0
"$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@" || status=$?
wait "$build" || { echo "building DeepSpeed's CPU ops failed" >&2; exit 1; }
exit "$status"
