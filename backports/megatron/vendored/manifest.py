"""``UPSTREAM.toml``, the provenance of a vendored folder: its keys and their types, the one
reader (text -> a checked ``UpstreamToml``) and the one writer (``render_upstream``), which a
sync, ``--rehash`` and ``backports new`` all use.

A hand-edited or half-written manifest must give one clear reason (``pr must be an integer``),
not a ``TypeError`` deep in the probe, nor a string of names checked one character at a time,
nor an empty file blamed on an edited vendored file.

``symbol`` names what the vendored file replaces: one name (``"fn"`` or ``"Class.method"``),
or, for an entry with several targets, a list of such names in the catalog's target order
(the first is the one a sync reads upstream). ``head_sha`` may be left out only by a
handwritten folder of an open pull request (no ``merge_sha``) whose head is not known, or by
a folder of a merged one that says ``head_unknown = true`` (a squash merge whose head no
available clone holds: handwritten, or derived by ``--from-pr`` from a plain clone); its
``origin_note`` says so, and git ancestry then checks ``merge_sha`` alone, or nothing.

``upstream_names`` maps a ``symbol`` to the name upstream gives it where the two differ (a
class renamed on main after the release: ``"FullyShardedDataParallel.__init__" =
"FullyShardedDataParallelV1.__init__"``); a sync reads the right-hand name upstream and writes
the left-hand one. Only names in ``symbol`` may be mapped (``upstream_name()``).
"""

import json
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import Any, NotRequired, TypedDict, cast

from ._outside import BackportError

FILE_NAME = "UPSTREAM.toml"
# Written by a sync or --rehash: a folder being set up may not have them yet.
HASHES = ("sha256", "files_sha256")


class ManifestError(BackportError):
    """An ``UPSTREAM.toml`` that cannot be read, or that breaks the schema."""


class UpstreamToml(TypedDict):
    """A checked ``UPSTREAM.toml``, as ``parse_upstream`` returns it (``REQUIRED`` and
    ``OPTIONAL`` below check each key). Keys a newer tool wrote stay in the dict unread, and
    the writer keeps them."""

    id: str
    repo: str
    pr: int
    path: str  # the upstream module's path in its repository
    symbol: str | list[str]  # see the module doc; ``symbols()`` gives a list
    file: str  # the vendored file in the folder that ``sha256`` covers
    origin: str  # "handwritten" or "synced"
    # Written by a sync or --rehash; a folder being set up may not have them yet.
    sha256: NotRequired[str]
    files_sha256: NotRequired[str]  # every .py file of the folder (``python_files_digest``)
    head_sha: NotRequired[str]
    head_unknown: NotRequired[bool]
    merge_sha: NotRequired[str]
    moved_path: NotRequired[str]
    origin_note: NotRequired[str]
    reads: NotRequired[list[str]]
    synced_sha: NotRequired[str]
    synced_path: NotRequired[str]
    synced_date: NotRequired[str]
    synced_repo: NotRequired[str]  # written by old syncs only; the next sync drops it
    upstream_sha256: NotRequired[str]
    upstream_tests: NotRequired[list[str]]
    decorators: NotRequired[dict[str, list[str]]]
    carry: NotRequired[list[str]]
    symbol_paths: NotRequired[dict[str, str]]
    fixed_symbols_sha256: NotRequired[dict[str, str]]
    upstream_names: NotRequired[dict[str, str]]  # symbol -> upstream's name for it


_HEX64 = re.compile(r"[0-9a-f]{64}")
_PATH = re.compile(r"(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+\.py")
_SHA = re.compile(r"[0-9a-f]{40}")
ORIGINS = ("handwritten", "synced")


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) and value.strip() else "a non-empty string"


# Characters that would end a Python comment, string or TOML string early, or open a
# str.format field: a value written into generated code never holds one.
UNSAFE_CHARS = frozenset("\"'\\{}`")


def unsafe_text(value: str) -> str | None:
    """Why ``value`` may not be written into generated code or a comment, or None."""
    if any(not ch.isprintable() for ch in value):
        return "a control character (a newline, a tab, ...)"
    bad = sorted({ch for ch in value if ch in UNSAFE_CHARS})
    return f"{' '.join(bad)}" if bad else None


def _plain(value: Any) -> str | None:
    """A non-empty string that is safe in a comment, a string literal and a format text."""
    if _text(value) is not None:
        return _text(value)
    return (
        None
        if unsafe_text(value) is None
        else "a plain string (no quotes, backslashes, braces or control characters)"
    )


def _source_path(value: Any) -> str | None:
    ok = isinstance(value, str) and bool(_PATH.fullmatch(value)) and ".." not in value.split("/")
    return None if ok else "a relative path of a .py file in the repository (path/to/module.py)"


def _pattern(pattern: re.Pattern[str], what: str) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        ok = isinstance(value, str) and pattern.fullmatch(value)
        return None if ok else what

    return check


def _positive_int(value: Any) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "a positive integer"


def _pull_requests(value: Any) -> str | None:
    ok = isinstance(value, list) and bool(value) and all(_positive_int(v) is None for v in value)
    return None if ok else "a list of pull-request numbers"


def _file_name(value: Any) -> str | None:
    ok = (
        isinstance(value, str)
        and value.endswith(".py")
        and "/" not in value
        and "\\" not in value
        and not value.startswith(".")
    )
    return None if ok else "a .py file name in the folder (no path)"


def _symbol(value: Any) -> str | None:
    one = isinstance(value, str) and all(part.isidentifier() for part in value.split("."))
    several = (
        isinstance(value, list)
        and bool(value)
        and all(_symbol(v) is None and isinstance(v, str) for v in value)
    )
    return None if one or several else 'a name ("fn" or "Class.method") or a list of names'


def _names(value: Any) -> str | None:
    ok = isinstance(value, list) and all(isinstance(v, str) and v.isidentifier() for v in value)
    return None if ok else "a list of Python names"


def _true(value: Any) -> str | None:
    return None if value is True else "true (or left out)"


def _decorator_table(value: Any) -> str | None:
    ok = isinstance(value, dict) and all(
        _symbol(k) is None
        and isinstance(v, list)
        and all(isinstance(d, str) and d.strip() and d.isprintable() for d in v)
        for k, v in value.items()
    )
    return None if ok else "a table of symbol = [decorator texts]"


def _path_table(value: Any) -> str | None:
    ok = isinstance(value, dict) and all(
        _symbol(k) is None and _source_path(v) is None for k, v in value.items()
    )
    return None if ok else "a table of symbol = path/to/module.py"


def _digest_table(value: Any) -> str | None:
    ok = isinstance(value, dict) and all(
        _symbol(k) is None and isinstance(v, str) and bool(_HEX64.fullmatch(v))
        for k, v in value.items()
    )
    return None if ok else "a table of symbol = sha256 (64 lowercase hex digits)"


def _name_table(value: Any) -> str | None:
    """Each name mapped to one of the same shape: a method stays a method."""
    ok = isinstance(value, dict) and all(
        isinstance(v, str)
        and _symbol(k) is None
        and _symbol(v) is None
        and k.count(".") == v.count(".")
        and k != v
        for k, v in value.items()
    )
    return None if ok else 'a table of symbol = its upstream name ("Class.m" = "NewClass.m")'


def _origin(value: Any) -> str | None:
    return None if value in ORIGINS else f"one of {', '.join(map(repr, ORIGINS))}"


_HEX = _pattern(_HEX64, "a sha256 (64 lowercase hex digits)")
_COMMIT = _pattern(_SHA, "a full commit SHA (40 lowercase hex digits; a short one is ambiguous)")
_NODE_ID = re.compile(r"(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]+\.py(?:::[A-Za-z_][A-Za-z0-9_]*)*")


def _node_ids(value: Any) -> str | None:
    ok = (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(v, str) and _NODE_ID.fullmatch(v) and ".." not in v for v in value)
    )
    return None if ok else "a list of pytest node ids (path/test_x.py[::Class][::test])"


REQUIRED: dict[str, Callable[[Any], str | None]] = {
    "id": _text,
    "repo": _plain,
    "pr": _positive_int,
    "path": _source_path,
    "symbol": _symbol,
    "file": _file_name,
    "sha256": _HEX,
    "files_sha256": _HEX,
    "origin": _origin,
}
OPTIONAL: dict[str, Callable[[Any], str | None]] = {
    "head_sha": _COMMIT,  # required, except in a handwritten folder (see the module doc)
    "head_unknown": _true,  # a merged, handwritten folder whose head is not known
    "merge_sha": _COMMIT,  # absent while the pull request is open
    "moved_path": _source_path,
    # Other pull requests that carry the same fix (open alternatives, a follow-up).
    "related_prs": _pull_requests,
    "origin_note": _text,
    "reads": _names,
    "synced_sha": _COMMIT,
    "synced_path": _source_path,
    "synced_date": _text,
    "upstream_sha256": _HEX,
    "upstream_tests": _node_ids,  # upstream's own tests of the fix, in its repository
    # Upstream's decorators of each vendored method, as written (left off the vendored body:
    # the applier decorates it with the live one, as the catalog's Target says).
    "decorators": _decorator_table,
    "carry": _names,  # module state vendored with the targets (a ContextVar, a helper)
    "symbol_paths": _path_table,  # a symbol or carried name -> its file, when not ``path``
    # Per carried symbol, the sha256 of its normalised AST at ``merge_sha``
    # (``evidence.fix_text``): the fix's text, for the ``upstream`` verdict's text evidence.
    "fixed_symbols_sha256": _digest_table,
    # A symbol -> the name upstream gives it at the commits a sync reads (a renamed class).
    "upstream_names": _name_table,
}


def manifest_problems(data: Mapping[str, Any], *, hashes_required: bool = True) -> list[str]:
    """What is wrong with a parsed ``UPSTREAM.toml``, one phrase per key; [] when valid.

    Unknown keys are allowed: a newer sync tool may write more. ``hashes_required=False``
    (a sync about to write them) lets ``sha256`` and ``files_sha256`` be missing.
    """
    if not data:
        return ["it is empty"]
    optional = () if hashes_required else HASHES
    problems = [f"{key} is missing" for key in REQUIRED if key not in data and key not in optional]
    handwritten = data.get("origin") == "handwritten"
    open_and_handwritten = handwritten and "merge_sha" not in data
    # A merged pull request's head may be unknown: handwritten, or derived from a plain clone.
    head_unknown = "merge_sha" in data and data.get("head_unknown") is True
    if "head_sha" not in data and not (open_and_handwritten or head_unknown):
        problems.append(
            "head_sha is missing (only a handwritten folder of an open pull request, or one "
            "that says head_unknown = true, may leave it out)"
        )
    for key, check in (*REQUIRED.items(), *OPTIONAL.items()):
        if key in data:
            wanted = check(data[key])
            if wanted is not None:
                problems.append(f"{key} must be {wanted}, not {data[key]!r}")
    problems += _unknown_upstream_names(data)
    return problems


def _unknown_upstream_names(data: Mapping[str, Any]) -> list[str]:
    """``upstream_names`` may map only the names ``symbol`` lists (a typo'd key would
    otherwise be read by nothing, and the sync would look the release's name up)."""
    names: Any = data.get("upstream_names")
    symbol: Any = data.get("symbol")
    if _name_table(names) is not None or _symbol(symbol) is not None:
        return []  # absent, or its own problem said above
    listed: list[str] = [symbol] if isinstance(symbol, str) else symbol
    stray = [key for key in names if key not in listed]
    return [
        f"upstream_names maps {key!r}, which symbol does not list ({', '.join(listed)})"
        for key in stray
    ]


def symbols(data: UpstreamToml) -> list[str]:
    """``symbol`` of a valid manifest as a list (one name, or several in target order)."""
    value = data["symbol"]
    return [value] if isinstance(value, str) else [str(v) for v in value]


def upstream_name(data: UpstreamToml, symbol: str) -> str:
    """The name upstream gives ``symbol`` (``upstream_names``), or ``symbol`` itself."""
    return data.get("upstream_names", {}).get(symbol, symbol)


def parse_upstream(text: str, where: str, *, hashes_required: bool = True) -> UpstreamToml:
    """The one reader of ``UPSTREAM.toml`` (the probe's and the sync's): its text parsed
    and checked against the schema; a ``ManifestError`` in one line naming ``where``."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ManifestError(f"cannot read {where}: {exc}") from exc
    problems = manifest_problems(data, hashes_required=hashes_required)
    if problems:
        raise ManifestError(f"{where} is not a valid {FILE_NAME}: {'; '.join(problems)}")
    return cast(UpstreamToml, data)


def render_upstream(old_text: str, data: UpstreamToml) -> str:
    """The one writer: ``data`` written over the old ``UPSTREAM.toml`` text (every value a
    TOML literal; comments and key order stay, keys ``data`` drops go, new keys follow in
    ``data``'s order). Editing a manifest needs tomlkit; a new one (``old_text`` holding
    comments at most, as ``backports new`` writes it) is written here without it. Refuses
    data the schema refuses, and text that would not read back as ``data``."""
    problems = manifest_problems(data, hashes_required=False)
    if problems:
        raise ManifestError(f"refusing to write an invalid {FILE_NAME}: {'; '.join(problems)}")
    text = _edited(old_text, data) if tomllib.loads(old_text) else _new(old_text, data)
    if tomllib.loads(text) != data:
        raise ManifestError(f"internal error: the {FILE_NAME} written would not read back")
    return text


def _edited(old_text: str, data: UpstreamToml) -> str:
    try:
        import tomlkit
    except ImportError as exc:
        raise ManifestError(
            f"writing {FILE_NAME} needs tomlkit: pip install 'megatron-backports[git]'"
        ) from exc
    document = tomlkit.parse(old_text)
    for key in [key for key in document if key not in data]:
        del document[key]
    for key, value in data.items():
        document[key] = value
    return tomlkit.dumps(document)


def _new(head: str, data: UpstreamToml) -> str:
    """``head`` (comments), then one ``key = value`` line per key in ``data``'s order, then
    its tables (a table's keys run to the end of the file, so tables come last)."""
    lines = [head.rstrip("\n")] if head.strip() else []
    tables: list[tuple[str, dict[str, Any]]] = []
    for key, value in data.items():
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {_literal(value)}")
    for key, table in tables:
        lines += ["", f"[{key}]", *(f"{_literal(k)} = {_literal(v)}" for k, v in table.items())]
    return "\n".join(lines) + "\n"


def _literal(value: object) -> str:
    """A TOML literal of a schema value: JSON's string escapes are TOML's basic string's."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(item) for item in value) + "]"
    return json.dumps(str(value), ensure_ascii=False)
