"""Step two of a sync: read the manifest's source file at the fetched commit (or the
module's planned new location, when the old one is gone or only forwards the symbol)."""

import ast
from dataclasses import dataclass
from typing import Any

from .errors import SourceError
from .scopes import defines


@dataclass(frozen=True)
class Source:
    path: str
    text: str
    note: str | None  # set when the planned new location was read instead of ``path``


def _blob_text(commit: Any, path: str) -> str | None:
    try:
        blob = commit.tree / path
    except KeyError:
        return None
    if blob.type != "blob":
        return None
    data = blob.data_stream.read()
    try:
        return str(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path} at {commit.hexsha[:12]} is not UTF-8: {exc}") from exc


def _only_forwards(text: str, symbol: str) -> bool:
    """True when the module parses but does not itself define ``symbol`` (a forwarder)."""
    try:
        return defines(ast.parse(text), symbol) is None
    except SyntaxError:
        return False


def read_source(commit: Any, path: str, symbol: str, moved: str | None) -> Source:
    """``path`` at ``commit``, or ``moved`` (the manifest's ``moved_path``) when ``path`` is
    gone or only forwards the top-level ``symbol`` to it."""
    short = commit.hexsha[:12]
    text = _blob_text(commit, path)
    moved_text = None if moved is None else _blob_text(commit, moved)
    if text is not None and (moved_text is None or not _only_forwards(text, symbol)):
        return Source(path, text, None)
    if moved is not None and moved_text is not None:
        why = "is gone" if text is None else f"does not define {symbol} (a forwarder)"
        note = f"{path} {why} at {short}; reading the planned new location {moved}"
        return Source(moved, moved_text, note)
    if moved is None:
        raise SourceError(f"{path} does not exist at {short}")
    raise SourceError(f"neither {path} nor {moved} exists at {short}")


def read_other(commit: Any, path: str) -> str:
    """Another file a backport vendors from (``symbol_paths``), at the same commit."""
    text = _blob_text(commit, path)
    if text is None:
        raise SourceError(f"{path} does not exist at {commit.hexsha[:12]}")
    return text
