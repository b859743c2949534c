#!/usr/bin/env python3
"""Carry the Megatron-LM commits ``backports upstream-tests`` needs to a host with no network.

A full bundle of Megatron-LM is far over the 64 MiB a GPU call may carry; the tests need
only the trees of the recorded commits. So ``create`` fetches each commit at depth 1 from a
clone into a scratch repository and bundles that (about 16 MB for #5077's merge, and
#6114's, a day apart, adds little); ``unpack`` makes a bare repository of the bundle on the
other side, which ``backports upstream-tests ID --repo DIR`` reads as it reads a clone.

    python3 tools/upstream_bundle.py create --repo ../Megatron-LM --out .upstream/mlm.bundle
    python3 tools/upstream_bundle.py unpack --bundle .upstream/mlm.bundle --dest /tmp/mlm.git

``create`` takes backport ids (their ``UPSTREAM.toml``'s merge_sha, else synced_sha, else
head_sha: the commit ``upstream-tests`` takes the tests from) or SHAs; by default the
entries whose recorded tests run on one GPU without Transformer Engine (#6114, #5077).
Each commit is kept as ``refs/backports/<id or sha>``. The bundle's commits have no parents
in it: ``unpack`` lists them in the repository's ``shallow`` file, as a ``--depth 1`` clone
does, so git reads them as complete. Only git and the standard library are needed.
Exit status: 0 written; 1 refused (over --max-mb); 2 bad input or a git error.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_IDS = ("megatron-lm-6114", "megatron-lm-5077")
MAX_MB = 60.0  # under the 64 MiB a call carries, with room for the repository's own files
_SHA = re.compile(r"[0-9a-f]{7,40}")


class BundleError(Exception):
    """One line for the user; exit status 2 (or 1 for a refusal)."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


def _git(*args: str, cwd: Path | None = None) -> str:
    git = shutil.which("git")
    if git is None:
        raise BundleError("needs the git program on PATH")
    done = subprocess.run([git, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        why = next((ln for ln in done.stderr.splitlines() if ln.strip()), f"exit {done.returncode}")
        raise BundleError(f"git {args[0]} failed: {why.strip()}")
    return done.stdout


def recorded_commit(backport_id: str, vendor: Path = ROOT / "vendor") -> str:
    """The commit ``upstream-tests`` takes ``backport_id``'s tests from."""
    manifest = vendor / backport_id.replace("-", "_") / "UPSTREAM.toml"
    if not manifest.is_file():
        raise BundleError(f"{backport_id}: no {manifest}")
    data = tomllib.loads(manifest.read_text(encoding="utf-8"))
    sha = data.get("merge_sha") or data.get("synced_sha") or data.get("head_sha")
    if not sha:
        raise BundleError(f"{backport_id}: {manifest} records no commit")
    return str(sha)


def _commits(names: list[str]) -> dict[str, str]:
    """ref name -> SHA, for ids and SHAs alike."""
    return {name: name if _SHA.fullmatch(name) else recorded_commit(name) for name in names}


def create(repo: str, names: list[str], out: Path, max_mb: float = MAX_MB) -> dict[str, str]:
    """Bundle each named commit (depth 1) from ``repo`` into ``out``; returns ref -> SHA."""
    commits = _commits(names)
    with tempfile.TemporaryDirectory(prefix="upstream-bundle-") as scratch:
        work = Path(scratch) / "shallow.git"
        _git("init", "--quiet", "--bare", str(work))
        _git("fetch", "--quiet", "--no-tags", "--depth", "1", repo, *commits.values(), cwd=work)
        for name, sha in commits.items():
            _git("update-ref", f"refs/backports/{name}", sha, cwd=work)
        out.parent.mkdir(parents=True, exist_ok=True)
        _git("bundle", "create", "--quiet", str(out.resolve()), "--all", cwd=work)
    size_mb = out.stat().st_size / 1e6
    if size_mb > max_mb:
        out.unlink()
        raise BundleError(f"{out}: {size_mb:.1f} MB is over --max-mb {max_mb:g}; not kept", 1)
    return commits


def unpack(bundle: Path, dest: Path) -> dict[str, str]:
    """A bare repository at ``dest`` holding the bundle's commits; returns ref -> SHA."""
    if dest.exists() and any(dest.iterdir()):
        raise BundleError(f"{dest} exists and is not empty")
    _git("init", "--quiet", "--bare", str(dest))
    heads = {}
    for line in _git("bundle", "unbundle", str(bundle.resolve()), cwd=dest).splitlines():
        sha, _, ref = line.partition(" ")
        if _SHA.fullmatch(sha) and ref.startswith("refs/"):
            heads[ref] = sha
    if not heads:
        raise BundleError(f"{bundle} holds no commits")
    # The commits came without their parents: mark them shallow, as a --depth 1 fetch does.
    (dest / "shallow").write_text("".join(f"{sha}\n" for sha in sorted(set(heads.values()))))
    for ref, sha in heads.items():
        _git("update-ref", ref, sha, cwd=dest)
        _git("cat-file", "-e", f"{sha}^{{tree}}", cwd=dest)
    return heads


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    steps = parser.add_subparsers(dest="step", required=True)
    make = steps.add_parser("create", help="bundle the commits from a clone")
    make.add_argument("names", nargs="*", metavar="ID_OR_SHA", default=list(DEFAULT_IDS))
    make.add_argument("--repo", required=True, help="a Megatron-LM clone (path or URL)")
    make.add_argument("--out", required=True, type=Path, help="the bundle file to write")
    make.add_argument(
        "--max-mb", type=float, default=MAX_MB, help=f"refuse above (default {MAX_MB:g})"
    )
    take = steps.add_parser("unpack", help="make a bare repository of a bundle")
    take.add_argument("--bundle", required=True, type=Path)
    take.add_argument("--dest", required=True, type=Path, help="a new (or empty) folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.step == "create":
            commits = create(args.repo, args.names, args.out, args.max_mb)
            size = args.out.stat().st_size / 1e6
            names = ", ".join(f"{name} {sha[:12]}" for name, sha in commits.items())
            print(f"wrote {args.out} ({size:.1f} MB): {names}")
        else:
            heads = unpack(args.bundle, args.dest)
            refs = ", ".join(f"{ref} {sha[:12]}" for ref, sha in heads.items())
            print(f"unpacked {args.bundle} into {args.dest}: {refs}")
    except BundleError as exc:
        print(f"upstream_bundle: {exc}", file=sys.stderr)
        return exc.status
    return 0


if __name__ == "__main__":
    sys.exit(main())
