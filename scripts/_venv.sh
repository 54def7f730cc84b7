# Sourced by scripts/demo.sh and scripts/test.sh: create or reuse .venv with everything installed.
# torch is installed first and pinned (2.13.0, the CPU build on this project's machines), so
# nothing later can pull a multi-GB CUDA build. Re-installs when pyproject.toml changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SCAFFOLD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.scaffold-installed"
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/_venv.sh" | cksum)"
if [ ! -x "$PY" ] || [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "setting up $VENV (first run: a few minutes)" >&2
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    if [ -n "${DEEPSPEED_OPS_LOG:-}" ]; then
        # scripts/test.sh: DeepSpeed before the rest, so that its CPU ops compile on the core
        # pip leaves idle while the rest installs (~100 s). The matrix's own build of them
        # waits for this one through torch's lock in TORCH_EXTENSIONS_DIR, then loads them.
        "$PY" -m pip install --quiet --disable-pip-version-check \
            "$(grep -o '"deepspeed==[^"]*"' "$ROOT/pyproject.toml" | tr -d '"')"
        PATH="$VENV/bin:$PATH" "$PY" "$ROOT/scripts/build_deepspeed_ops.py" \
            >"$DEEPSPEED_OPS_LOG" 2>&1 &
    fi
    "$PY" -m pip install --quiet --disable-pip-version-check -e "$ROOT[dev]"
    echo "$WANT" > "$STAMP"
fi
# The venv's tools first, for this script and every process it starts: torch builds DeepSpeed's
# ops with the first `ninja` on PATH, and a system ninja (1.11, build log v5) next to the venv's
# (1.13, log v7) makes each process discard the other's build log and recompile (~30-55 s).
export PATH="$VENV/bin:$PATH"
