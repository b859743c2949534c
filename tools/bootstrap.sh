#!/usr/bin/env bash
# Create (or reuse) the project's Python 3.12 virtual environment and install the project
# with torch and megatron-core 0.19.2 into it. Sourced by tools/run-job and tools/run-tests.
#   PYTHON=/path/to/python3.12   interpreter to build the venv from (default: find 3.12)
#   VENV=.venv                   where the venv lives
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
case "$VENV" in /*) ;; *) VENV=$ROOT/$VENV ;; esac

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

# Reinstall only when the project's dependencies changed.
stamp="$VENV/.megatron-backports-installed"
want=$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "[bootstrap] installing megatron-backports[dev] (torch, megatron-core 0.19.2) into $VENV" >&2
    log="$VENV/install.log"
    if ! { "$VENV/bin/python" -m pip install --upgrade pip &&
           "$VENV/bin/python" -m pip install -e "$ROOT[dev]"; } >"$log" 2>&1; then
        tail -n 40 "$log" >&2
        echo "[bootstrap] pip install failed; full log: $log" >&2
        exit 1
    fi
    echo "$want" > "$stamp"
fi
export VENV ROOT
