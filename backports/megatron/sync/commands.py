"""A sync as named steps: fetch the commit, read the source, vendor it, stage the pair, show
the diff, prove the fix in a child, swap the pair in.

Also ``rehash`` (record the hashes of a handwritten folder) and ``check`` (no network:
compare every vendored folder with its ``UPSTREAM.toml``). The local changes the catalog
declares live outside ``vendor/`` and wrap whatever is vendored, so a sync keeps them and
names each one it kept.

Each step says what it did to the ``SyncReport`` it is handed (the commands wing shows it) and
raises a ``SyncError`` where it cannot go on: nothing here prints or ends the process.
"""

import datetime
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..evidence.fix_text import symbol_digests
from ..vendored import (
    ManifestError,
    UpstreamToml,
    VendoredFolder,
    drift_reason,
    folder_of,
    folders_under,
    python_files_digest,
    render_upstream,
    symbols,
    upstream_name,
)
from ..vendored.manifest import FILE_NAME
from .errors import Interrupted, Refused, SourceError, UsageError, WriteError
from .fetch import cache_clone, checked_sha, fetch, repo_location, resolve_commit
from .render import Piece, Provenance, Vendored, render
from .report import SyncReport
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
from .verify import local_changes, sniff_candidate, vendored_names

# What stands between the staged pair and the swap: raises ``Refused`` to write nothing.
Proof = Callable[[Path], None]


@dataclass(frozen=True)
class _Candidate:
    """Upstream's code at one commit, vendored."""

    sha: str
    source: Source
    vendored: Vendored
    # Per symbol, the digest of its text at this commit when it is the fix's merge
    # (``fixed_symbols_sha256``); None at any other commit.
    fixed_symbols: dict[str, str] | None = None


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _module_name(path: str) -> str:
    return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def _tidy(vendor: Path, dry_run: bool, report: SyncReport) -> None:
    """Put right what a killed run left, or (dry run: nothing written) say it is there."""
    if dry_run:
        for path in leftovers(vendor):
            report.say(f"note: {path.name} is left by a killed sync; the next sync puts it right")
        return
    try:
        done = recover_interrupted(vendor)
    except OSError as exc:
        raise WriteError(f"cannot tidy up after a killed sync in {vendor}: {exc}") from exc
    for line in done:
        report.say(f"note: {line}")


# ---- the candidate --------------------------------------------------------------------------


def _pieces(manifest: UpstreamToml, source: Source) -> list[Piece]:
    """What to vendor: each target symbol, then the module state listed in ``carry``;
    each read from ``symbol_paths``'s file for it, else from the manifest's source, under
    the name upstream gives it (``upstream_names``), and defined under the name the catalog
    entry's target looks for."""
    paths = manifest.get("symbol_paths", {})
    names = vendored_names(str(manifest["id"]))
    pieces = []
    for name, carried in [(s, False) for s in symbols(manifest)] + [
        (c, True) for c in manifest.get("carry", [])
    ]:
        path = paths.get(name, source.path)
        module = _module_name(manifest["path"] if path == source.path else path)
        read_as = "" if carried else upstream_name(manifest, name)
        pieces.append(Piece(path, module, name, carried, names.get(name, ""), read_as))
    return pieces


def _provenance(manifest: UpstreamToml, sha: str, source_path: str) -> Provenance:
    """The header of the vendored file: where its text was read, at which commit."""
    moved = manifest.get("moved_path")
    return Provenance(
        repo=manifest["repo"],
        pr=manifest["pr"],
        sha=sha,
        path=source_path,
        symbol=", ".join(symbols(manifest)),
        target_module=_module_name(manifest["path"]),
        # Not once the move is done: the source is then read from the new place.
        moved_path=None if source_path == moved else moved,
        upstream_names=tuple(manifest.get("upstream_names", {}).items()),
    )


def _fetch_candidate(
    folder: VendoredFolder,
    sha: str | None,
    repo_arg: str | None,
    pr: int | None,
    report: SyncReport,
) -> _Candidate:
    """The commit fetched into the cache clone, its source files read while the clone is
    open, and upstream's code vendored from them (parsed, never run)."""
    manifest = folder.manifest
    url = repo_location(repo_arg if repo_arg is not None else manifest["repo"])
    with cache_clone(url) as repo:
        fetch(repo, url, sha, pr)
        commit = resolve_commit(repo, sha, url, pr)
        if pr is not None and not repo.is_ancestor(commit.hexsha, f"refs/pull/{pr}/head"):
            report.say(f"note: {commit.hexsha[:12]} is not on refs/pull/{pr}/head")
        # What the source must define, as upstream names it.
        owner = upstream_name(manifest, symbols(manifest)[0]).partition(".")[0]
        source = read_source(commit, manifest["path"], owner, manifest.get("moved_path"))
        if source.note:
            report.say(f"note: {source.note}")
        pieces = _pieces(manifest, source)
        sources = {source.path: source.text}
        for piece in pieces:
            if piece.path not in sources:
                sources[piece.path] = read_other(commit, piece.path)
        hexsha = str(commit.hexsha)
        fixed = _fix_texts(manifest, hexsha, source.path, sources, lambda p: read_other(commit, p))
    vendored = render(sources, pieces, _provenance(manifest, hexsha, source.path))
    report.say(f"reads from the target module: {', '.join(vendored.reads) or 'nothing'}")
    for symbol, texts in vendored.decorators.items():
        report.say(f"recorded the decorators of {symbol}: {', '.join('@' + d for d in texts)}")
    return _Candidate(hexsha, source, vendored, fixed)


def _fix_texts(
    manifest: UpstreamToml,
    sha: str,
    source_path: str,
    sources: dict[str, str],
    read: Callable[[str], str],
) -> dict[str, str] | None:
    """At the fix's merge commit, each symbol's normalised digest (what the ``upstream``
    verdict compares the installed text with), read under upstream's name for it and keyed
    by the catalog's; None at another commit, or where a symbol's text is not found there."""
    if sha != manifest.get("merge_sha"):
        return None
    paths = manifest.get("symbol_paths", {})
    known = dict(sources)

    def text_of(symbol: str) -> str | None:
        path = paths.get(symbol, source_path)
        if path not in known:
            try:
                known[path] = read(path)
            except SourceError:  # not there: no record, the sync goes on
                return None
        return known[path]

    names = symbols(manifest)
    catalog_name = {upstream_name(manifest, name): name for name in names}
    found = symbol_digests(lambda read_as: text_of(catalog_name[read_as]), list(catalog_name))
    keyed = {catalog_name[read_as]: digest for read_as, digest in found.items()}
    return keyed if len(keyed) == len(names) else None


def _synced_manifest(folder: VendoredFolder, candidate: _Candidate) -> UpstreamToml:
    """The manifest after a sync: full SHAs, and the canonical repository URL it already
    names (never the local path or mirror a sync fetched from)."""
    data = folder.manifest.copy()
    data.pop("synced_repo", None)  # the next three are written anew, or no more
    data.pop("synced_date", None)
    data.pop("decorators", None)
    vendored, sha = candidate.vendored, candidate.sha
    data["sha256"] = _sha256(vendored.text.encode("utf-8"))
    data["origin"] = "synced"
    data["origin_note"] = (
        f"Synced by backports sync from {candidate.source.path} at {sha}: "
        "upstream's code as it is, its module-global reads made live look-ups."
    )
    data["synced_sha"] = sha
    data["synced_path"] = candidate.source.path
    data["upstream_sha256"] = _sha256(vendored.segment.encode("utf-8"))
    data["reads"] = list(vendored.reads)
    # A handwritten folder of an open pull request may not know its head: the commit
    # synced now is the first one known to be upstream's.
    data.setdefault("head_sha", sha)
    if vendored.decorators:
        data["decorators"] = vendored.decorators
    if candidate.fixed_symbols is not None:  # at another commit, the merge's record stays
        data["fixed_symbols_sha256"] = candidate.fixed_symbols
    return data


def _with_date(new: UpstreamToml, old: UpstreamToml) -> UpstreamToml:
    """Today's date when anything changed; the old date when a re-sync changes nothing."""
    unchanged = {k: v for k, v in old.items() if k != "synced_date"} == new
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    return {**new, "synced_date": (old.get("synced_date") if unchanged else None) or today}


# ---- the proof ------------------------------------------------------------------------------


def _prover(folder: VendoredFolder, sha: str, force: bool, report: SyncReport) -> Proof:
    """The sniff, in a child, on the staged file: refuse (exit 1, nothing written) code that
    does not show the fix, or that this environment cannot sniff, unless ``force``."""

    def prove(staged: Path) -> None:
        report.say(f"{folder.id}: sniffing the candidate in a child interpreter")
        sniffed = sniff_candidate(folder.id, staged)
        if sniffed.fixed and sniffed.sha256 == _sha256(staged.read_bytes()):
            report.say(f"{folder.id}: the sniff shows the fix at {sha}: {sniffed.summary}")
            return
        if sniffed.fixed:
            said = "the sniffed file is not the staged one"
        elif sniffed.crashed:
            said = (
                f"{sniffed.summary}: {folder.shown()} at {sha} was not judged (its code does "
                "not run as the sniff calls it on the installed release; look at what it needs)"
            )
        elif sniffed.fixed is None:
            install = "install it first" if sniffed.not_here else "sniff it where it can run"
            said = f"not sniffed: {sniffed.summary} ({install}, or --force)"
        else:
            said = f"{folder.shown()} at {sha} would not carry the fix; the sniff saw: "
            said += sniffed.summary
        if not force:
            raise Refused(f"{said}; nothing written (--force writes it anyway)")
        report.say(f"warning: {said}; writing it anyway (--force): the probe will say incompatible")

    return prove


# ---- the commands -----------------------------------------------------------------------------


def sync(
    vendor: Path,
    backport_id: str,
    sha: str | None,
    repo_arg: str | None,
    pr: int | None,
    dry_run: bool,
    *,
    force: bool = False,
    report: SyncReport | None = None,
) -> SyncReport:
    """Vendor the backport's code at the commit; ``Refused`` (exit 1) unless the sniff shows
    the fix, or ``force``. A dry run shows the diff and runs nothing it fetched."""
    report = SyncReport() if report is None else report
    if sha is None and pr is None:
        raise UsageError("a sync needs --sha, --pr, or both")
    if pr is not None and pr <= 0:
        raise UsageError(f"--pr must be a positive pull-request number, not {pr}")
    sha = None if sha is None else checked_sha(sha)
    _tidy(vendor, dry_run, report)
    folder = folder_of(vendor, backport_id)
    candidate = _fetch_candidate(folder, sha, repo_arg, pr, report)
    data = _synced_manifest(folder, candidate)
    prove = _prover(folder, candidate.sha, force, report)
    _write_pair(folder, candidate.vendored.text, data, dry_run, prove, report)
    _say_kept_local_changes(folder.id, report)
    return report


def rehash(
    vendor: Path, backport_id: str, dry_run: bool, report: SyncReport | None = None
) -> SyncReport:
    """Record sha256 and files_sha256 of a handwritten folder as it is."""
    report = SyncReport() if report is None else report
    _tidy(vendor, dry_run, report)
    folder = folder_of(vendor, backport_id)
    origin = folder.manifest["origin"]
    if origin != "handwritten":
        raise UsageError(
            f"{folder.shown(FILE_NAME)} says origin = {origin!r}: --rehash records the "
            "hashes of handwritten code only; re-sync synced code instead"
        )
    try:
        text = folder.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {folder.file}: {exc}") from exc
    data: UpstreamToml = {**folder.manifest, "sha256": _sha256(text.encode("utf-8"))}
    _write_pair(folder, text, data, dry_run, None, report)
    return report


def _write_pair(
    folder: VendoredFolder,
    text: str,
    data: UpstreamToml,
    dry_run: bool,
    prove: Proof | None,
    report: SyncReport,
) -> None:
    """Stage the vendored file and its UPSTREAM.toml (files_sha256 over the staged folder),
    say the diff, and, unless nothing changed or ``dry_run``, ``prove`` the staged file
    (a sync's sniff) and swap the pair in."""
    with staged_copy(folder.path, beside=not dry_run) as stage:
        staged = stage / folder.file.name
        try:
            write_file(staged, text)
            data = {**data, "files_sha256": python_files_digest(stage)}
            if prove is not None:  # a sync is proved and dated; a rehash records hashes only
                data = _with_date(data, folder.manifest)
            manifest_text = _rendered(folder, data)
            write_file(stage / FILE_NAME, manifest_text)
        except OSError as exc:
            raise WriteError(f"cannot write the staged copy of {folder.path}: {exc}") from exc
        file_diff = unified_diff(read_text(folder.file), text, folder.shown(folder.file.name))
        manifest_diff = unified_diff(folder.manifest_text, manifest_text, folder.shown(FILE_NAME))
        if not file_diff + manifest_diff:
            report.say(f"{folder.id}: {folder.shown()} is up to date; nothing written")
            return
        report.write(file_diff + manifest_diff)
        if dry_run:
            if prove is not None:
                report.say(
                    f"note: {folder.id}: not sniffed: dry run (a sync sniffs before it writes)"
                )
            report.say(f"{folder.id}: dry run; nothing written")
            return
        if prove is not None:
            prove(staged)
        try:
            held = swap_in(stage, folder.path)
        except KeyboardInterrupt as exc:
            raise Interrupted(f"interrupted; {folder.shown()} keeps its old files") from exc
    names = [folder.file.name] * bool(file_diff) + [FILE_NAME] * bool(manifest_diff)
    wrote = f"wrote {' and '.join(names)} in {folder.shown()}"
    if held:
        raise Interrupted(f"interrupted after the swap: {wrote}")
    report.say(f"{folder.id}: {wrote}")


def _rendered(folder: VendoredFolder, data: UpstreamToml) -> str:
    """The new ``UPSTREAM.toml`` text (the one writer; a refusal is a usage error)."""
    try:
        return render_upstream(folder.manifest_text, data)
    except ManifestError as exc:
        raise UsageError(str(exc)) from exc


def _say_kept_local_changes(backport_id: str, report: SyncReport) -> None:
    """The local changes live outside vendor/ and wrap whatever function is vendored."""
    changes = local_changes(backport_id)
    if changes is None:
        report.say(
            f"{backport_id}: not in this environment's catalog (a plugin not installed "
            "here?): its local changes, if any, live in its own package and are kept"
        )
    elif not changes:
        report.say(f"{backport_id}: the catalog declares no local changes")
    for name, reason in changes or []:
        report.say(f"kept local change {name}: {reason}")


def check(vendor: Path, only: str | None = None, report: SyncReport | None = None) -> SyncReport:
    """Compare every vendored folder with its UPSTREAM.toml: ``failed`` where one differs,
    or a killed sync left one set aside."""
    report = SyncReport() if report is None else report
    stray = leftovers(vendor)
    if stray:
        # A folder may be set aside, not in its place: nothing to compare until a sync
        # (or --rehash) puts it right.
        for path in stray:
            report.say(
                f"leftover: {path.name} from a killed sync; the next sync or --rehash tidies it"
            )
        report.failed = True
        return report
    folders = [folder_of(vendor, only)] if only else folders_under(vendor)
    if not folders:
        raise UsageError(f"no vendored backports (*/{FILE_NAME}) under {vendor}")
    drifted = 0
    for folder in folders:
        reason = drift_reason(folder.integrity(), folder.id, folder.manifest["origin"])
        if reason is not None:
            drifted += 1
            report.say(f"drifted: {reason}")
    if drifted:
        report.say(f"{drifted} vendored folder(s) differ from {FILE_NAME}; re-sync, do not edit")
        report.failed = True
        return report
    report.say(f"ok: {len(folders)} vendored folder(s) match their {FILE_NAME}")
    return report
