#!/usr/bin/env bash
# The main job: render the default project into ./demo and train it on the digits, printing the
# run summary. Re-running replaces ./demo.
source "$(dirname "$0")/_venv.sh"
cd "$ROOT"
rm -rf demo
"$VENV/bin/scaffold" new demo --defaults
cd demo
PYTHONPATH=src "$PY" -m demo.train "$@"
