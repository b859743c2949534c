"""The step between vendoring and writing: does the candidate code carry the fix?

The entry's own sniff runs on the freshly vendored file, upstream-only (the vendored code
alone: the local changes the default mode wraps around it must not mask a function that
lacks the fix). A commit from before the fix, a typo'd SHA or a regressed PR head is then
refused instead of shipped as a silent no-op that ``check`` would pass.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Sniffed", "sniff_candidate"]


@dataclass(frozen=True)
class Sniffed:
    """What the sniff saw on the candidate; ``fixed`` None when it could not run here."""

    fixed: bool | None
    summary: str


@contextlib.contextmanager
def _imported(text: str, file_name: str, backport_id: str) -> Iterator[types.ModuleType]:
    """The candidate file imported from a temporary folder, as a module of its own that
    nothing else can import; gone from ``sys.modules`` afterwards."""
    name = f"_backports_sync_candidate_{backport_id.replace('-', '_')}"
    with tempfile.TemporaryDirectory(prefix="backports-sync-") as folder:
        path = Path(folder) / file_name
        path.write_text(text, encoding="utf-8")
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up
        try:
            spec.loader.exec_module(module)
            yield module
        finally:
            sys.modules.pop(name, None)


def sniff_candidate(backport_id: str, text: str, file_name: str) -> Sniffed:
    """The entry's sniff on ``text`` (the vendored file a sync would write), upstream-only."""
    from ..catalog import by_id  # loads the entries and plugins: only a sync needs them
    from ..decision import sniff_vendored as sniff_replacement

    try:
        spec = by_id(backport_id)
    except KeyError:
        return Sniffed(None, "not in this environment's catalog, so not sniffed")
    try:
        with _imported(text, file_name, backport_id) as module:
            result = sniff_replacement(spec, module, upstream_only=True)
    except Exception as exc:  # the candidate does not even import: it shows no fix
        first = (str(exc).splitlines() or [""])[0]
        return Sniffed(False, f"importing it raised {type(exc).__name__}: {first}")
    return Sniffed(result.fixed, result.summary)
