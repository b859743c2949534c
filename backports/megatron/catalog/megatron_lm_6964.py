"""NVIDIA/Megatron-LM#6964: a stale ``flash_attn.cute`` no longer breaks attention's import.

megatron-core 0.18 to 0.19.2 probe for FA4 at import time in
``megatron.core.transformer.attention`` by importing ``flash_attn.cute`` whenever that path
exists. flash-attn 2.8.x ships a stale ``flash_attn.cute`` that raises ``AttributeError``
beside a newer ``nvidia-cutlass-dsl``; the probe catches only ``ImportError``, so the
attention module and every model built on it (GPT layer specs, MLA) fail to import.
Upstream decides FA4 by the installed ``flash-attn-4`` distribution instead.

Module-level code: the entry is an ``ImportGuard``, in place before the module executes.
"""

import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from packaging.version import Version

from ..evidence.fingerprints import module_file
from ..interpreter.children import child_path, run_python
from ..kinds.import_guard import ImportGuard
from ..model import BackportSpec, Resolved, SniffFailed, SniffResult
from ._untyped import MegatronFunction

_MODULE = "megatron.core.transformer.attention"
# What flash-attn 2.8.x's flash_attn.cute raises beside a newer nvidia-cutlass-dsl.
_STALE_ERROR = "module 'cutlass.cute.core' has no attribute 'ThrMma'"
_CHILD_TIMEOUT_S = 600

# Run in a child: import the module under a guard named "module:qualname" and say how it went.
_CHILD = """
import importlib, importlib.metadata, json, sys
module_name, qualname, target = sys.argv[1], sys.argv[2], sys.argv[3]
# The scenario: a stale flash_attn.cute and no flash-attn-4 distribution, also where one is
# installed (then the guard stands aside, and FA4 stays on: that is no part of the sniff).
_version = importlib.metadata.version
def _version_without_fa4(name):
    if name.lower().replace("_", "-") == "flash-attn-4":
        raise importlib.metadata.PackageNotFoundError(name)
    return _version(name)
importlib.metadata.version = _version_without_fa4
guard = importlib.import_module(module_name)
for part in qualname.split("."):
    guard = getattr(guard, part)
try:
    with guard():
        module = importlib.import_module(target)
    seen = {"imported": True, "HAVE_FA4": bool(module.HAVE_FA4)}
except Exception as exc:
    seen = {"imported": False, "error": f"{type(exc).__name__}: {exc}"}
import megatron  # which copy the child judged (audit puts a candidate first on the path)
seen["megatron"] = list(megatron.__path__)[0]
print("SNIFF " + json.dumps(seen), flush=True)
"""


def stale_flash_attn(folder: Path) -> Path:
    """A ``flash_attn`` package in ``folder`` whose ``cute`` raises as flash-attn 2.8.x's
    does beside a newer cutlass; no flash-attn-4 distribution. Returns ``folder``."""
    cute = folder / "flash_attn" / "cute"
    cute.mkdir(parents=True, exist_ok=True)
    (folder / "flash_attn" / "__init__.py").write_text('__version__ = "2.8.3"\n')
    (cute / "__init__.py").write_text(f"raise AttributeError({_STALE_ERROR!r})\n")
    return folder


def import_in_child(guard: MegatronFunction, first_on_path: Path) -> dict[str, object]:
    """Import the attention module in a fresh, isolated interpreter under ``guard``, with
    ``first_on_path`` ahead of this process's own path (so the child sees the megatron-core
    this process probes: ``audit`` puts a candidate first); the backports are off there."""
    path = child_path([str(first_on_path)])
    args = [guard.__module__, guard.__qualname__, _MODULE]
    # Forked from the zygote (torch imported once): the attention module is imported afresh.
    done = run_python(_CHILD, args, path=path, timeout=_CHILD_TIMEOUT_S, shared_imports=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("SNIFF ")]
    if done.returncode != 0 or len(lines) != 1:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SniffFailed(f"the child exited {done.returncode}: {tail[0]}")
    return json.loads(lines[0][len("SNIFF ") :])  # type: ignore[no-any-return]


# What a child saw, per (guard, interpreter, its path, attention.py's stat): the child costs
# an import of torch and megatron (tens of seconds), and its outcome depends on nothing else.
_SEEN: dict[tuple[object, ...], dict[str, object]] = {}


def _module_file_stat() -> tuple[str, int, int] | None:
    """Where the child will find the attention module, and its size and mtime; found on
    the path without importing anything (megatron's packages may import it)."""
    found = module_file(_MODULE, child_path())
    if found is None:
        return None
    stat = found.stat()
    return str(found.resolve()), stat.st_size, stat.st_mtime_ns


def _import_beside_stale_cute(guard: MegatronFunction) -> dict[str, object]:
    key: tuple[object, ...] = (guard.__module__, guard.__qualname__, sys.executable)
    key += (tuple(child_path()), _module_file_stat())
    if key not in _SEEN:
        with tempfile.TemporaryDirectory(prefix="megatron-lm-6964-") as folder:
            _SEEN[key] = import_in_child(guard, stale_flash_attn(Path(folder)))
    return dict(_SEEN[key])


def _sniff(targets: Sequence[Resolved]) -> SniffResult:
    """Fixed iff the module imports with FA4 off beside a stale flash_attn.cute."""
    (target,) = targets
    seen = _import_beside_stale_cute(target.original)
    detail = {"stale_flash_attn_cute": seen, "megatron": seen.pop("megatron", None)}
    if seen == {"imported": True, "HAVE_FA4": False}:
        summary = f"{_MODULE} imports with FA4 off beside a stale flash_attn.cute"
        return SniffResult(True, summary, detail)
    if seen.get("error") == f"AttributeError: {_STALE_ERROR}":
        summary = (
            f"a stale flash_attn.cute breaks the import of {_MODULE} (AttributeError: "
            f"{_STALE_ERROR}): FA4 is decided by the import path, not the flash-attn-4 "
            "distribution"
        )
        return SniffResult(False, summary, detail)
    raise SniffFailed(f"beside a stale flash_attn.cute the import gave {seen}")


SPEC = BackportSpec(
    id="megatron-lm-6964",
    title="Attention import: FA4 decided by the flash-attn-4 distribution, not the path",
    targets=(
        ImportGuard(
            distribution="megatron-core",
            modules=(_MODULE,),
            attribute="HAVE_FA4",
            replacement="fa4_import_guard",
        ),
    ),
    # The module-level FA4 probe arrives in 0.18.
    target_since=Version("0.18"),
    # No megatron-core release carries it yet (0.19.2 is the newest on PyPI and lacks it).
    fixed_in=None,
    sniff=_sniff,
    sniff_in_child=True,
)
