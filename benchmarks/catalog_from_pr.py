"""``backports new --from-pr`` on the five pull requests of issue 46, before each is written
by hand: what round 2 of ``--from-pr`` proves, what it refuses and why.

    python benchmarks/catalog_from_pr.py [--mirror PATH] [--prs 5976 6357 6507 6321 7466]
                                         [--out PATH]

The clone is a plain ``git clone`` of a local mirror of NVIDIA/Megatron-LM into a scratch
folder outside the repository, with the heads of the five pull requests that the mirror has
fetched (``refs/pull/N/head``, as the command asks of a clone without them); not timed.
Each pull request runs as ``python -P -m backports.megatron new --from-pr N --repo CLONE
--dest DIR`` in the running interpreter (its megatron-core is the release it derives
against), one at a time, from the scratch folder. Per pull request the JSON holds the
outcome (``proven``: exit 0 and a plugin written; ``not in the clone``: the clone knows no
such pull request; ``refused``: anything else), the exit code, the reason line, the sniff's
route per symbol when proven, and the wall time. ``--prs 6321`` runs one (the runs of
others already in ``--out`` are kept). Writes ``benchmarks/results/catalog_from_pr.json``
(or ``--out``) with a provenance block (date, machine, the code's commit).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import code_folder, git_state, machine, megatron_core_version, now

ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
# The five pull requests of issue 46 and what each brings that the catalog lacks.
PRS = {
    5976: "one fix, two distributions (megatron-core and megatron-fsdp)",
    6357: "construction-time closures, a renamed class",
    6507: "an epilogue on get_megatron_optimizer, imported by name elsewhere",
    6321: "outside megatron.core, an exit-status translation",
    7466: "open pull request (not in the mirror), a sniff that needs two ranks",
}
_ROUTE = re.compile(r"^  (\S+)\s.*sniff: route ([abc])", re.MULTILINE)
# What the command says when the clone does not know the pull request at all.
_NOT_FOUND = re.compile(r"newer than this clone|not (found )?in (this|the) clone", re.I)


def _clone(mirror: Path, scratch: Path, numbers: list[int]) -> Path:
    clone = scratch / "Megatron-LM"
    subprocess.run(["git", "clone", "--quiet", str(mirror), str(clone)], check=True)
    # A plain clone holds branches only; --from-pr reads a pull request's head, which a user
    # fetches as the command asks ("fetch the pull requests first"): the heads the mirror has
    # of the five, whichever are run (all of refs/pull/* would not do: the mirror lacks
    # objects of some old ones).
    listed = subprocess.run(
        ["git", "-C", str(clone), "ls-remote", "origin", "refs/pull/*/head"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    wanted = [f"refs/pull/{n}/head" for n in numbers if f"refs/pull/{n}/head" in listed]
    if wanted:
        specs = [f"+{ref}:{ref}" for ref in wanted]
        subprocess.run(["git", "-C", str(clone), "fetch", "--quiet", "origin", *specs], check=True)
    return clone


def _env(scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    env["TMPDIR"] = str(scratch)
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    env["MEGATRON_BACKPORTS_CACHE_DIR"] = str(scratch / "verdict-cache")
    return env


def _reason(exit_code: int, out: str, err: str) -> str:
    """The line that says why: the command's one error line (``backports new: ...``) where
    it printed one (a conflict prints the hunk after it), else stderr's last line for a
    refusal, else the report's last."""
    said = [line.strip() for line in err.splitlines() if line.startswith("backports new:")]
    if exit_code and said:
        return said[-1]
    lines = [line for line in (err if exit_code else out).splitlines() if line.strip()]
    if not lines:
        lines = [line for line in (out + "\n" + err).splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _outcome(exit_code: int, written: bool, reason: str) -> str:
    if exit_code == 0 and written:
        return "proven"
    if _NOT_FOUND.search(reason):
        return "not in the clone"
    return "refused"


def _one(number: int, clone: Path, scratch: Path) -> dict[str, Any]:
    dest = scratch / f"plugin-{number}"
    argv = [sys.executable, "-P", "-m", "backports.megatron", "new", "--from-pr", str(number)]
    argv += ["--repo", str(clone), "--dest", str(dest)]
    start = time.monotonic()
    done = subprocess.run(
        argv, capture_output=True, text=True, cwd=scratch, env=_env(scratch), check=False
    )
    wall = time.monotonic() - start
    reason = _reason(done.returncode, done.stdout, done.stderr)
    outcome = _outcome(done.returncode, dest.is_dir(), reason)
    return {
        "pr": number,
        "shape": PRS.get(number, ""),
        "outcome": outcome,
        "exit": done.returncode,
        "reason": reason,
        "routes": dict(_ROUTE.findall(done.stdout)) if outcome == "proven" else {},
        "wall_seconds": round(wall, 1),
        "report": done.stdout.splitlines(),
        "stderr": [line for line in done.stderr.splitlines() if line.strip()][-12:],
    }


def _merge(out: Path, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of earlier invocations (``--prs`` one at a time) kept, this one's replacing
    theirs, in the order of ``PRS``."""
    kept: dict[int, dict[str, Any]] = {}
    if out.is_file():
        kept = {run["pr"]: run for run in json.loads(out.read_text(encoding="utf-8"))["runs"]}
    kept.update({run["pr"]: run for run in runs})
    order = list(PRS)
    return sorted(kept.values(), key=lambda r: order.index(r["pr"]) if r["pr"] in order else 99)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--prs", nargs="+", type=int, default=list(PRS))
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/catalog_from_pr.json"
    )
    args = parser.parse_args(argv)
    started = now()
    # The code as it was when the runs began (the worktree may change while they run).
    code = git_state(code_folder())
    scratch = Path(tempfile.mkdtemp(prefix="bench-catalog-from-pr-"))
    runs = []
    try:
        clone = _clone(args.mirror, scratch, list(PRS))
        for number in args.prs:
            runs.append(_one(number, clone, scratch))
            run = runs[-1]
            print(f"#{number}: {run['outcome']} (exit {run['exit']}) in {run['wall_seconds']} s")
            print(f"  {run['reason']}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {
        "what": "backports new --from-pr on issue 46's five pull requests "
        "(benchmarks/catalog_from_pr.py)",
        "provenance": {
            "date": started,
            "finished": now(),
            "machine": machine(),
            "code": code,
            "megatron_core": megatron_core_version(),
            "mirror_main": subprocess.run(
                ["git", "--git-dir", str(args.mirror), "rev-parse", "refs/heads/main"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout.strip(),
        },
        "runs": _merge(args.out, runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return report


if __name__ == "__main__":
    main()
