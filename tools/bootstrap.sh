#!/usr/bin/env bash
# Create (or reuse) the project's Python 3.12 virtual environment and install the project
# with torch and megatron-core 0.19.2 into it. Sourced by tools/run-job and tools/run-tests.
#   PYTHON=/path/to/python3.12   interpreter to build the venv from (default: find 3.12)
#   VENV=.venv                   where the venv lives
#   BOOTSTRAP_EXTRA=dev          the extra to install: `runtime` (torch and megatron-core, what
#                                tools/run-job sets) or `dev` (the test toolchain too: the default)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
case "$VENV" in /*) ;; *) VENV=$ROOT/$VENV ;; esac
EXTRA=${BOOTSTRAP_EXTRA:-dev}
case "$EXTRA" in runtime|dev) ;; *) echo "[bootstrap] BOOTSTRAP_EXTRA=$EXTRA: runtime or dev" >&2; exit 2 ;; esac

find_python() {
    if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"; return; fi
    for candidate in python3.12 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
           "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null; then
            echo "$candidate"; return
        fi
    done
    # pyenv keeps 3.12 off PATH on some machines.
    if command -v pyenv >/dev/null 2>&1 && PYENV_VERSION=3.12.1 python3.12 -V >/dev/null 2>&1; then
        echo "env PYENV_VERSION=3.12.1 python3.12"; return
    fi
    echo "no Python 3.12 found (megatron-core >= 0.17 needs it); set PYTHON=/path/to/python3.12" >&2
    exit 2
}

if [ ! -x "$VENV/bin/python" ]; then
    py=$(find_python)
    echo "[bootstrap] creating $VENV with $py" >&2
    $py -m venv "$VENV"
fi
"$VENV/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' || {
    echo "[bootstrap] $VENV is not Python 3.12; remove it or set VENV=" >&2; exit 2; }

# What a working install has: this clone's package, its console script, and the big
# dependencies. A stamp alone is not enough: after `pip uninstall megatron-backports` it
# still says "installed" while .venv/bin/backports is gone.
install_problem() {
    [ -x "$VENV/bin/backports" ] || { echo "$VENV/bin/backports is missing"; return; }
    # -I: neither the caller's folder nor PYTHONPATH may stand in for the install.
    "$VENV/bin/python" -I - "$ROOT" "$EXTRA" <<'PY' 2>&1 || true
import importlib.metadata, importlib.util, sys
from pathlib import Path
needed = ["megatron-backports", "megatron-core", "torch"] + (["pytest"] if sys.argv[2] == "dev" else [])
for name in needed:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        sys.exit(f"{name} is not installed")
spec = importlib.util.find_spec("backports.megatron")
origin = spec.origin if spec else None
if origin is None or not Path(origin).resolve().is_relative_to(Path(sys.argv[1]).resolve()):
    sys.exit(f"backports.megatron comes from {origin}, not from {sys.argv[1]}")
PY
}

# The stamp names pyproject.toml's hash and the extra installed: a dev install serves the job
# too, a runtime install does not serve the tests.
stamp="$VENV/.megatron-backports-installed"
pyproject=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
want="$pyproject $EXTRA"
have=$(cat "$stamp" 2>/dev/null || true)
if [ "$have" != "$want" ] && [ "$have" != "$pyproject dev" ]; then
    why="first install, pyproject.toml changed, or the $EXTRA extra is not installed"
else
    why=$(install_problem)
fi
if [ -n "$why" ]; then
    log="$VENV/install.log"
    started=$SECONDS
    rm -f "$stamp"
    echo "[bootstrap] installing megatron-backports[$EXTRA] into $VENV ($why)" >&2
    echo "[bootstrap] the first time: torch and megatron-core 0.19.2 (a few GB, a minute or two); full log: $log" >&2
    : >"$log"
    # pip's own progress (a bar per download on a terminal; name and size otherwise) on
    # stderr, where the other set-up lines go; --log keeps pip's verbose log.
    echo "[bootstrap] step 1/2: pip" >&2
    if ! "$VENV/bin/python" -m pip install --log "$log" -q --upgrade pip 1>&2 ||
       ! { echo "[bootstrap] step 2/2: megatron-backports[$EXTRA] and its dependencies" >&2
           "$VENV/bin/python" -m pip install --log "$log" -e "$ROOT[$EXTRA]" 1>&2; }; then
        echo "[bootstrap] pip install failed; full log: $log" >&2
        exit 1
    fi
    why=$(install_problem)
    if [ -n "$why" ]; then
        echo "[bootstrap] pip finished but the install is incomplete: $why; full log: $log" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
    echo "[bootstrap] done in $((SECONDS - started)) s; $VENV holds $(du -sh "$VENV" | cut -f1)" >&2
fi
export VENV ROOT
