"""Step four: which catalog entry already carries a merge (a builtin, or an installed
plugin's), from each entry's ``UPSTREAM.toml``: its pull-request number and merge SHA."""

from dataclasses import dataclass

from .model import Carrier, Merge


@dataclass(frozen=True)
class _Record:
    id: str
    source: str
    pr: int
    merge_sha: str | None


def catalog_records() -> list[_Record]:
    """Every catalog entry whose vendored folder says which pull request it carries (an
    entry whose ``UPSTREAM.toml`` cannot be read is left out: ``status`` reports it)."""
    from ... import catalog
    from ...errors import BackportError
    from ...vendored import read_upstream

    records = []
    for spec in catalog.entries():
        try:
            upstream = read_upstream(spec.vendored)
        except (BackportError, OSError, AttributeError, TypeError):
            continue
        records.append(
            _Record(spec.id, catalog.source(spec.id), upstream["pr"], upstream.get("merge_sha"))
        )
    return records


def carried_by(merge: Merge, records: list[_Record]) -> tuple[Carrier, ...]:
    """The entries carrying ``merge``'s pull request; how each was matched."""
    found = []
    for record in records:
        if merge.pr is None or record.pr != merge.pr:
            continue
        if record.merge_sha in (None, merge.sha):
            match = "pr and merge sha" if record.merge_sha else "pr number (no merge sha recorded)"
        else:
            match = f"pr number (its merge sha {record.merge_sha[:12]} differs)"
        found.append(Carrier(record.id, record.source, match))
    return tuple(found)
