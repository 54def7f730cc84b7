# Sourced by scripts/demo.sh and scripts/test.sh: create or reuse .venv with everything installed,
# and .venv-vision beside it for the image projects.
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
# The image projects' environment: torchvision's compiled ops load only beside the torch build
# they were compiled with, which the CPU build above is not ('operator torchvision::nms does not
# exist'). .venv-vision holds a matching pair from PyPI (the CUDA build, which runs on a CPU;
# ~50 s and 5.5 GB from this machine's disk) with timm, and reads everything else from .venv's
# site-packages after its own (the .pth below), so nothing else is installed twice. The matrix
# runs the image variants' suites with it (tests/conftest.py: project_python).
VISION_VENV="${SCAFFOLD_VISION_VENV:-$ROOT/.venv-vision}"
VISION_STAMP="$VISION_VENV/.scaffold-installed"
VISION_WANT="$WANT $(cat "$ROOT/scripts/vision-requirements.txt" | cksum)"
if [ ! -x "$VISION_VENV/bin/python" ] || [ ! -f "$VISION_STAMP" ] \
    || [ "$(cat "$VISION_STAMP")" != "$VISION_WANT" ]; then
    echo "setting up $VISION_VENV (torch and torchvision for the image projects)" >&2
    rm -rf "$VISION_VENV"
    python3 -m venv "$VISION_VENV"
    "$VISION_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
        -r "$ROOT/scripts/vision-requirements.txt"
    # DeepSpeed imports triton where it is installed, and the CUDA build's triton fails to
    # import without a GPU (scripts/dependency_ends.py does the same).
    "$VISION_VENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y triton
    MAIN_PACKAGES="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    VISION_PACKAGES="$("$VISION_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    echo "import site; site.addsitedir('$MAIN_PACKAGES')" > "$VISION_PACKAGES/zz-scaffold-dev.pth"
    echo "$VISION_WANT" > "$VISION_STAMP"
fi
export SCAFFOLD_VISION_PYTHON="$VISION_VENV/bin/python"
# The venv's tools first, for this script and every process it starts: torch builds DeepSpeed's
# ops with the first `ninja` on PATH, and a system ninja (1.11, build log v5) next to the venv's
# (1.13, log v7) makes each process discard the other's build log and recompile (~30-55 s).
export PATH="$VENV/bin:$PATH"
