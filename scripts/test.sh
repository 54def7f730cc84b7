#!/usr/bin/env bash
# The test suite: scaffold's own tests and, through the matrix, every variant's generated tests.
# Extra arguments go to pytest, e.g. `scripts/test.sh -m "not slow"` for the quick subset.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
"$PY" -m ruff check --no-cache .
"$PY" -m ruff format --check --no-cache .
# DeepSpeed's CPU ops, compiled once into the cache every test process reads, while the tests
# start: the matrix queues the ZeRO variants after the other multi-process ones, and a process
# that needs an op still being built waits on torch's build lock. Only when the run selects a
# test that loads them (marked deepspeed_ops, the matrix's ZeRO variants): a build takes both
# cores for ~2 minutes. Collecting the selection to find out takes a few seconds.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
build=""
# (exit status 5: nothing selected; the run below says so)
selection="$("$PY" -m pytest --collect-only -q -p no:cacheprovider --report-deepspeed-ops "$@")" ||
    [ $? -eq 5 ] || { echo "$selection" >&2; exit 1; }
if grep -qx "needs DeepSpeed's CPU ops" <<<"$selection"; then
    "$PY" scripts/build_deepspeed_ops.py &
    build=$!
fi
status=0
"$PY" -m pytest -n 2 --dist worksteal --durations=15 "$@" || status=$?
if [ -n "$build" ]; then
    wait "$build" || { echo "building DeepSpeed's CPU ops failed" >&2; exit 1; }
fi
exit "$status"
