"""Child interpreters that take no code from the caller's working directory.

A sniff that must import a module afresh (an import guard's), a Triton kernel run under
``TRITON_INTERPRET=1``, a candidate release in ``audit``: each runs in a child interpreter.
``python -c`` would put the working directory first on the child's ``sys.path``, so a
``json.py`` in whatever folder the user stands in (a shared ``/tmp``, a Megatron-LM
checkout) would run, or be judged in place of the installed code. So every child here is
``-I`` (no working directory, no ``PYTHON*`` variables, no user site), its path is given
explicitly (the caller's, less the working directory), it starts in a private empty folder,
and the backports are off in it (it judges megatron as it stands) unless asked otherwise.
"""

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import zygote

PATH_VARIABLE = "MEGATRON_BACKPORTS_CHILD_PATH"

# Run first in every child: its sys.path is the one given (json and os are the standard
# library's: -I keeps the working directory off the path before this line runs).
_PRELUDE = (
    "import json as _json, os as _os, sys as _sys\n"
    f"_sys.path[:] = _json.loads(_os.environ.pop({PATH_VARIABLE!r}))\n"
    "del _json, _os, _sys\n"
)


def _of_the_working_directory(entry: str, cwd: str) -> bool:
    """``''``, the folder itself, or a relative path that names something in it (a
    relative entry that names nothing is a path hook's key, such as an editable install's
    placeholder: kept)."""
    if not entry:
        return True
    if os.path.isabs(entry):
        return os.path.realpath(entry) == cwd
    return os.path.exists(entry)


def child_path(first: Sequence[str] = ()) -> list[str]:
    """``first``, then this process's ``sys.path`` without the working directory: what a
    child searches, and what a verdict it gave is keyed on."""
    cwd = os.path.realpath(os.getcwd())
    kept = [entry for entry in sys.path if not _of_the_working_directory(entry, cwd)]
    return list(dict.fromkeys([*first, *kept]))


def run_python(
    script: str,
    args: Sequence[str] = (),
    *,
    path: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    backports: bool = False,
    timeout: float,
    shared_imports: bool = False,
) -> "subprocess.CompletedProcess[str]":
    """Run ``script`` in ``python -I`` with ``args``, searching ``path`` (default:
    ``child_path()``), in a private empty working directory; output captured as text.

    ``env``: the environment (default: this process's); ``backports``: leave the backports
    to the environment's switches (default: off, ``MEGATRON_BACKPORTS=0``).
    ``shared_imports``: a sniff's child, forked from the zygote that imported torch once
    (``interpreter.zygote``) where it can stand for a fresh one (backports off only).
    """
    environ = dict(os.environ if env is None else env)
    searched = list(child_path() if path is None else path)
    environ[PATH_VARIABLE] = json.dumps(searched)
    if not backports:
        environ["MEGATRON_BACKPORTS"] = "0"
    if shared_imports and not backports:
        done = zygote.run(
            _PRELUDE + script,
            "<string>",
            "-c",
            args,
            path=searched,
            env=environ,
            timeout=timeout,
            base_path=child_path(),
        )
        if done is not None:
            return done
    with tempfile.TemporaryDirectory(prefix="megatron-backports-child-") as cwd:
        return subprocess.run(
            [sys.executable, "-I", "-c", _PRELUDE + script, *args],
            cwd=cwd,
            env=environ,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def run_python_file(
    file: Path,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    timeout: float,
    path: Sequence[str] | None = None,
) -> "subprocess.CompletedProcess[str]":
    """Run the script ``file`` (which sets its own ``sys.path``) in ``python -I`` with
    ``args`` and the environment ``env``, in a private empty working directory; forked from
    the zygote where it can stand for a fresh interpreter (``path``: what the script puts
    on its path, default ``child_path()``)."""
    searched = list(child_path() if path is None else path)
    done = zygote.run(
        file.read_text(encoding="utf-8"),
        str(file),
        str(file),
        args,
        path=searched,
        env=env,
        timeout=timeout,
        base_path=child_path(),
    )
    if done is not None:
        return done
    with tempfile.TemporaryDirectory(prefix="megatron-backports-child-") as cwd:
        return subprocess.run(
            [sys.executable, "-I", str(file), *args],
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
