#!/usr/bin/env python3
"""Record in each vendored folder's ``UPSTREAM.toml`` the fix's text per carried symbol:
``fixed_symbols_sha256``, the sha256 of each symbol's normalised AST at ``merge_sha``
(``backports.megatron.evidence.fix_text``, the same function the ``upstream`` verdict
checks the installed text with). Read from a local clone; nothing is fetched.

    python tools/record_fixed_symbols.py --repo /path/to/Megatron-LM [--backport ID]

A folder without ``merge_sha`` (an open pull request), or whose merge the clone lacks, is
left as it is and named. The digests are provenance, not upstream text. Exit status: 0
done, 2 a bad argument.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(1, str(ROOT))  # this checkout's package, installed or not

from backports.megatron.evidence.fix_text import FIELD, symbol_digests  # noqa: E402
from backports.megatron.vendored.folder import VendoredFolder, folders_under  # noqa: E402
from backports.megatron.vendored.manifest import (  # noqa: E402
    FILE_NAME,
    UpstreamToml,
    render_upstream,
    symbols,
    upstream_name,
)


def _git_show(repo: Path, commit: str, path: str) -> str | None:
    done = subprocess.run(
        ["git", "-C", str(repo), "show", f"{commit}:{path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout if done.returncode == 0 else None


def fixed_symbols(repo: Path, manifest: UpstreamToml) -> dict[str, str] | None:
    """``{symbol: digest}`` at the manifest's merge commit in ``repo`` (each symbol read
    under upstream's name for it, ``upstream_names``), or None where it has no merge, or
    the clone lacks a symbol's text there."""
    merge = manifest.get("merge_sha")
    if merge is None:
        return None
    paths = manifest.get("symbol_paths", {})

    def read(symbol: str) -> str | None:
        wanted = [paths.get(symbol, manifest["path"]), manifest.get("moved_path")]
        for path in filter(None, wanted):
            text = _git_show(repo, merge, path)
            if text is not None:
                return text
        return None

    names = symbols(manifest)
    catalog_name = {upstream_name(manifest, name): name for name in names}
    found = symbol_digests(lambda read_as: read(catalog_name[read_as]), list(catalog_name))
    keyed = {catalog_name[read_as]: digest for read_as, digest in found.items()}
    return keyed if len(keyed) == len(names) else None


def _record(repo: Path, folder: VendoredFolder) -> str:
    found = fixed_symbols(repo, folder.manifest)
    if found is None:
        return f"{folder.id}: left as it is (no merge_sha, or {repo} lacks its text)"
    data: UpstreamToml = {**folder.manifest, FIELD: found}  # type: ignore[typeddict-item]
    text = render_upstream(folder.manifest_text, data)
    if text == folder.manifest_text:
        return f"{folder.id}: up to date"
    (folder.path / FILE_NAME).write_text(text, encoding="utf-8")
    return f"{folder.id}: recorded {', '.join(found)}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="record_fixed_symbols.py")
    parser.add_argument("--repo", type=Path, required=True, help="a local Megatron-LM clone")
    parser.add_argument("--vendor", type=Path, default=ROOT / "vendor")
    parser.add_argument("--backport", help="one backport id (default: every folder)")
    args = parser.parse_args(argv)
    folders = [f for f in folders_under(args.vendor) if args.backport in (None, f.id)]
    if not folders:
        print(f"no vendored folder {args.backport or ''} under {args.vendor}", file=sys.stderr)
        return 2
    for folder in folders:
        print(_record(args.repo, folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
