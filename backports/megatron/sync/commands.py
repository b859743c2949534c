"""A sync as named steps: fetch the commit, read the source, vendor it, write the pair.

Also ``rehash`` (record the hashes of a handwritten folder) and ``check`` (no network:
compare every vendored folder with its ``UPSTREAM.toml``). The local changes the catalog
declares live outside ``vendor/`` and wrap whatever is vendored, so a sync keeps them and
names each one it kept.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..upstream_schema import symbols
from .assemble import Piece, render_pieces
from .errors import Interrupted, Refused, UsageError, WriteError
from .fetch import cache_clone, fetch, repo_location, resolve_commit
from .manifest import (
    MANIFEST,
    Backport,
    files_digest,
    known_backports,
    load_backport,
    local_changes,
    render_manifest,
)
from .rewrite import Provenance, Vendored, render_vendored
from .source import Source, read_other, read_source
from .stage import (
    leftovers,
    read_text,
    recover_interrupted,
    staged_copy,
    swap_in,
    unified_diff,
    write_file,
)
from .verify import sniff_candidate

__all__ = ["check", "rehash", "sync"]

_SHA = re.compile(r"[0-9a-fA-F]{4,40}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _new_manifest(
    backport: Backport, commit: Any, source: Source, vendored: Vendored
) -> dict[str, Any]:
    """The manifest after a sync: full SHAs, and the canonical repository URL it already
    names (never the local path or mirror a sync fetched from)."""
    data = dict(backport.manifest)
    for key in ("synced_repo", "synced_date"):
        data.pop(key, None)
    data.update(
        sha256=_sha256(vendored.text.encode("utf-8")),
        origin="synced",
        origin_note=(
            f"Synced by backports sync from {source.path} at {commit.hexsha}: "
            "upstream's code as it is, its module-global reads made live look-ups."
        ),
        synced_sha=commit.hexsha,
        synced_path=source.path,
        upstream_sha256=_sha256(vendored.segment.encode("utf-8")),
        reads=list(vendored.reads),
    )
    # A handwritten folder of an open pull request may not know its head: the commit
    # synced now is the first one known to be upstream's.
    data.setdefault("head_sha", commit.hexsha)
    return data


def _with_date(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """Today's date when anything changed; the old date when a re-sync changes nothing."""
    unchanged = {k: v for k, v in old.items() if k != "synced_date"} == new
    date = old.get("synced_date") if unchanged else None
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return {**new, "synced_date": date or today}


def _check_args(sha: str | None, pr: int | None) -> None:
    if sha is None and pr is None:
        raise UsageError("a sync needs --sha, --pr, or both")
    if sha is not None and not _SHA.fullmatch(sha):
        raise UsageError(f"--sha must be 4 to 40 hex digits, not {sha!r}")
    if pr is not None and pr <= 0:
        raise UsageError(f"--pr must be a positive pull-request number, not {pr}")


def _tidy(vendor: Path, dry_run: bool) -> None:
    """Put right what a killed run left, or (dry run: nothing written) say it is there."""
    if dry_run:
        for path in leftovers(vendor):
            print(f"note: {path.name} is left by a killed sync; the next sync puts it right")
        return
    try:
        done = recover_interrupted(vendor)
    except OSError as exc:
        raise WriteError(f"cannot tidy up after a killed sync in {vendor}: {exc}") from exc
    for line in done:
        print(f"note: {line}")


def _pieces(manifest: dict[str, Any], source: Source) -> list[Piece]:
    """What to vendor: each target symbol, then the module state listed in ``carry``;
    each read from ``symbol_paths``'s file for it, else from the manifest's source."""
    paths: dict[str, str] = manifest.get("symbol_paths", {})
    pieces = []
    for name, carried in [(s, False) for s in symbols(manifest)] + [
        (c, True) for c in manifest.get("carry", [])
    ]:
        path = paths.get(name, source.path)
        module = _module_name(manifest["path"] if path == source.path else path)
        pieces.append(Piece(path, module, name, carried))
    return pieces


def _is_one_function(manifest: dict[str, Any]) -> bool:
    names = symbols(manifest)
    plain = len(names) == 1 and "." not in names[0]
    return plain and not manifest.get("carry") and not manifest.get("symbol_paths")


def _first_owner(manifest: dict[str, Any]) -> str:
    """The top-level name the manifest's source must define: the first symbol's owner."""
    return symbols(manifest)[0].partition(".")[0]


def _vendor_at(
    manifest: dict[str, Any], commit: Any, source: Source
) -> Callable[[Provenance], tuple[Vendored, dict[str, list[str]]]]:
    """Read every other file now (the clone is open); render once the provenance is known."""
    if _is_one_function(manifest):
        return lambda p: (render_vendored(source.text, p.symbol, p), {})
    pieces = _pieces(manifest, source)
    sources = {source.path: source.text}
    for piece in pieces:
        if piece.path not in sources:
            sources[piece.path] = read_other(commit, piece.path)
    return lambda p: render_pieces(sources, pieces, p)


def _provenance(manifest: dict[str, Any], sha: str, source_path: str) -> Provenance:
    """The header of the vendored file: where its text was read, at which commit."""
    return Provenance(
        repo=manifest["repo"],
        pr=manifest["pr"],
        sha=sha,
        path=source_path,
        symbol=", ".join(symbols(manifest)),
        target_module=_module_name(manifest["path"]),
        # Not once the move is done: the source is then read from the new place.
        moved_path=None
        if source_path == manifest.get("moved_path")
        else manifest.get("moved_path"),
    )


def sync(
    vendor: Path,
    backport_id: str,
    sha: str | None,
    repo_arg: str | None,
    pr: int | None,
    dry_run: bool,
    *,
    force: bool = False,
) -> int:
    """Vendor the backport's code at the commit; refused (exit 1) unless it shows the fix,
    or ``force``."""
    _check_args(sha, pr)
    sha = None if sha is None else sha.lower()
    _tidy(vendor, dry_run)
    backport = load_backport(vendor, backport_id)
    manifest = backport.manifest
    url = repo_location(repo_arg if repo_arg is not None else manifest["repo"])
    with cache_clone(url) as repo:
        fetch(repo, url, sha, pr)
        commit = resolve_commit(repo, sha, url, pr)
        if pr is not None and not repo.is_ancestor(commit.hexsha, f"refs/pull/{pr}/head"):
            print(f"note: {commit.hexsha[:12]} is not on refs/pull/{pr}/head")
        source = read_source(commit, {**manifest, "symbol": _first_owner(manifest)})
        if source.note:
            print(f"note: {source.note}")
        vendor_text = _vendor_at(manifest, commit, source)
    vendored, decorators = vendor_text(_provenance(manifest, commit.hexsha, source.path))
    print(f"reads from the target module: {', '.join(vendored.reads) or 'nothing'}")
    for symbol, texts in decorators.items():
        print(f"recorded the decorators of {symbol}: {', '.join('@' + d for d in texts)}")
    _refuse_without_fix(backport, commit.hexsha, vendored.text, force)
    data = _new_manifest(backport, commit, source, vendored)
    data.pop("decorators", None)
    if decorators:
        data["decorators"] = decorators
    code = _write_pair(backport, vendored.text, data, dry_run, dated=True)
    _say_kept_local_changes(backport.id)
    return code


def _refuse_without_fix(backport: Backport, sha: str, text: str, force: bool) -> None:
    """Refuse (exit 1, nothing written) code whose sniff does not show the fix."""
    sniffed = sniff_candidate(backport.id, text, backport.file.name)
    if sniffed.fixed is None:
        print(f"note: {backport.id}: {sniffed.summary}")
        return
    if sniffed.fixed:
        print(f"{backport.id}: the sniff shows the fix at {sha}: {sniffed.summary}")
        return
    said = f"{backport.shown()} at {sha} would not carry the fix; the sniff saw: {sniffed.summary}"
    if not force:
        raise Refused(f"{said}; nothing written (--force writes it anyway)")
    print(f"warning: {said}; writing it anyway (--force): the probe will say incompatible")


def rehash(vendor: Path, backport_id: str, dry_run: bool) -> int:
    """Record sha256 and files_sha256 of a handwritten folder as it is."""
    _tidy(vendor, dry_run)
    backport = load_backport(vendor, backport_id)
    origin = backport.manifest.get("origin")
    if origin != "handwritten":
        raise UsageError(
            f"{backport.shown(MANIFEST)} says origin = {origin!r}: --rehash records the "
            "hashes of handwritten code only; re-sync synced code instead"
        )
    try:
        text = backport.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {backport.file}: {exc}") from exc
    data = {**backport.manifest, "sha256": _sha256(text.encode("utf-8"))}
    return _write_pair(backport, text, data, dry_run, dated=False)


def _write_pair(
    backport: Backport, text: str, data: dict[str, Any], dry_run: bool, dated: bool
) -> int:
    """Stage the vendored file and its UPSTREAM.toml (files_sha256 over the staged
    folder), print the diff, and swap the pair in unless nothing changed or ``dry_run``."""
    with staged_copy(backport.folder, beside=not dry_run) as stage:
        try:
            write_file(stage / backport.file.name, text)
            data = {**data, "files_sha256": files_digest(stage)}
            if dated:
                data = _with_date(data, backport.manifest)
            manifest_text = render_manifest(backport.manifest_text, data)
            write_file(stage / MANIFEST, manifest_text)
        except OSError as exc:
            raise WriteError(f"cannot write the staged copy of {backport.folder}: {exc}") from exc
        file_diff = unified_diff(read_text(backport.file), text, backport.shown(backport.file.name))
        manifest_diff = unified_diff(
            backport.manifest_text, manifest_text, backport.shown(MANIFEST)
        )
        diff = file_diff + manifest_diff
        if not diff:
            print(f"{backport.id}: {backport.shown()} is up to date; nothing written")
            return 0
        sys.stdout.write(diff)
        if dry_run:
            print(f"{backport.id}: dry run; nothing written")
            return 0
        try:
            held = swap_in(stage, backport.folder)
        except KeyboardInterrupt as exc:
            raise Interrupted(f"interrupted; {backport.shown()} keeps its old files") from exc
    names = [backport.file.name] * bool(file_diff) + [MANIFEST] * bool(manifest_diff)
    wrote = f"wrote {' and '.join(names)} in {backport.shown()}"
    if held:
        raise Interrupted(f"interrupted after the swap: {wrote}")
    print(f"{backport.id}: {wrote}")
    return 0


def _say_kept_local_changes(backport_id: str) -> None:
    """The local changes live outside vendor/ and wrap whatever function is vendored."""
    changes = local_changes(backport_id)
    if changes is None:
        print(
            f"{backport_id}: not in this environment's catalog (a plugin not installed "
            "here?): its local changes, if any, live in its own package and are kept"
        )
    elif not changes:
        print(f"{backport_id}: the catalog declares no local changes")
    for name, reason in changes or []:
        print(f"kept local change {name}: {reason}")


def _drift(backport: Backport) -> list[str]:
    """One line per way the folder differs from its UPSTREAM.toml."""
    lines = []
    expected = backport.manifest.get("sha256")
    try:
        actual = _sha256(backport.file.read_bytes())
    except OSError as exc:
        actual = f"unreadable ({exc.strerror})"
    if actual != expected:
        shown = backport.shown(backport.file.name)
        lines.append(f"drifted: {shown} (sha256 {actual}, {MANIFEST} says {expected})")
    folder_expected = backport.manifest.get("files_sha256")
    folder_actual = files_digest(backport.folder)
    if folder_expected is None:
        lines.append(
            f"drifted: {backport.shown()} ({MANIFEST} has no files_sha256; "
            "re-sync, or --rehash a handwritten folder)"
        )
    elif folder_actual != folder_expected:
        lines.append(
            f"drifted: {backport.shown()}*.py "
            f"(files_sha256 {folder_actual}, {MANIFEST} says {folder_expected})"
        )
    return lines


def check(vendor: Path, only: str | None = None) -> int:
    """0 when every vendored folder matches its UPSTREAM.toml, else 1."""
    stray = leftovers(vendor)
    if stray:
        # A folder may be set aside, not in its place: nothing to compare until a sync
        # (or --rehash) puts it right.
        for path in stray:
            print(f"leftover: {path.name} from a killed sync; the next sync or --rehash tidies it")
        return 1
    backports = [load_backport(vendor, only)] if only else known_backports(vendor)
    if not backports:
        raise UsageError(f"no vendored backports (*/{MANIFEST}) under {vendor}")
    drifted = 0
    for backport in backports:
        lines = _drift(backport)
        drifted += bool(lines)
        for line in lines:
            print(line)
    if drifted:
        print(f"{drifted} vendored folder(s) differ from {MANIFEST}; re-sync, do not edit")
        return 1
    print(f"ok: {len(backports)} vendored folder(s) match their {MANIFEST}")
    return 0
