"""``backports new --from-pr`` over a corpus none of the outside checks use (issue 44): the
pull requests merged on main between the 0.18 release branch point and the 0.19 one that
change files under ``megatron/core`` and say "fix" in their subject (59 on the mirror).

    python benchmarks/from_pr_corpus.py [--python VENV/bin/python] [--prs N ...]
                                        [--limit K] [--out PATH] [--list]

The clone is a plain ``git clone`` of the local mirror (no pull refs: a merged pull request
resolves from main's history). Each pull request runs as ``PYTHON -P -m backports.megatron
new --from-pr N --repo CLONE --dest DIR`` from a scratch folder, one at a time; ``--python``
names the interpreter whose megatron-core is the release derived against (the issue asks
for 0.18.2: a fix cherry-picked into 0.18.x is then an "already present" case). Per pull
request the JSON holds: files touched (from git), outcome (``proven``, ``already present``,
``refused``), the reason line, the sniff's route per symbol, the soundness figures the
report prints (rewrites passed, candidate sniffs discarded) where it prints them, and the
wall time. ``eligible`` marks the pull requests the issue's goal counts: at most 3 files,
and not refused because a touched symbol is missing from the installed release or a hunk
does not apply to its text. Runs already in ``--out`` are kept (``--prs`` / ``--limit``
add to them); the summary is recomputed over every run held.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _provenance import code_folder, git_state, machine, now
from catalog_from_pr import _env, _reason

ROOT = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
BRANCH_POINT_0_18 = "de030fc5823e59d7e3c3a2c7c64a9a384566acfb"
BRANCH_POINT_0_19 = "818b2580da69431a24cc261c969f5e4b0722fac7"
_PR = re.compile(r"\(#(\d+)\)")
_ROUTE = re.compile(r"^  (\S+)\s.*sniff: route ([abc])", re.MULTILINE)
_PRESENT = re.compile(r"already (has|carries|present)", re.I)
# Refusals the goal does not count: the fix cannot apply to this release at all (a touched
# symbol or a name it reads is not in the installed release; a hunk does not apply).
_NOT_APPLICABLE = re.compile(r"\[(outside-the-release|conflict)\]")
# The proof's first line ("sniff soundness: N semantics-preserving rewrite(s) ...; M
# candidate sniff(s) discarded by them"), and a no-route refusal's "(M candidate sniff(s)
# discarded by the rewrites)".
_REWRITES = re.compile(r"sniff soundness: (\d+) semantics-preserving rewrite")
_DISCARDED = re.compile(r"(\d+) candidate sniff\(s\) discarded by the")


def corpus(mirror: Path) -> list[dict[str, Any]]:
    """The pull requests of the corpus, oldest first: number, merge commit, subject, the
    files under megatron/core it changes and all it changes."""
    log = subprocess.run(
        [
            "git",
            "--git-dir",
            str(mirror),
            "log",
            "--first-parent",
            "--reverse",
            "--format=%H %s",
            f"{BRANCH_POINT_0_18}..{BRANCH_POINT_0_19}",
            "--",
            "megatron/core",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    prs = []
    for line in log:
        sha, _, subject = line.partition(" ")
        # The merged pull request is the last (#N) of the subject: a re-land names the
        # pull request it carries first ("Fix ... (#4699) (#5067)" merged #5067).
        numbers = _PR.findall(subject)
        if "fix" not in subject.lower() or not numbers:
            continue
        files = subprocess.run(
            ["git", "--git-dir", str(mirror), "diff", "--name-only", f"{sha}^1", sha],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        prs.append(
            {"pr": int(numbers[-1]), "merge": sha, "subject": subject, "files": len(files)}
        )
    return prs


def _installed(python: str) -> str:
    return subprocess.run(
        [
            python,
            "-I",
            "-c",
            "from importlib.metadata import version as v; print(v('megatron-core'))",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.strip()


def _one(entry: dict[str, Any], python: str, clone: Path, scratch: Path) -> dict[str, Any]:
    number = entry["pr"]
    dest = scratch / f"plugin-{number}"
    argv = [python, "-P", "-m", "backports.megatron", "new", "--from-pr", str(number)]
    argv += ["--repo", str(clone), "--dest", str(dest)]
    start = time.monotonic()
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        cwd=scratch,
        env=_env(scratch),
        check=False,
        timeout=1800,
    )
    wall = time.monotonic() - start
    reason = _reason(done.returncode, done.stdout, done.stderr)
    text = done.stdout + "\n" + done.stderr
    if done.returncode == 0 and dest.is_dir():
        outcome = "proven"
    elif done.returncode == 0 and _PRESENT.search(text):
        outcome = "already present"
    else:
        outcome = "refused"
    rewrites, discarded = _REWRITES.search(text), _DISCARDED.search(text)
    return {
        **entry,
        "outcome": outcome,
        "exit": done.returncode,
        "reason": reason,
        "eligible": entry["files"] <= 3
        and not (outcome == "refused" and _NOT_APPLICABLE.search(reason)),
        "routes": dict(_ROUTE.findall(done.stdout)) if outcome == "proven" else {},
        "rewrites_passed": int(rewrites.group(1)) if rewrites else None,
        "sniffs_discarded": int(discarded.group(1)) if discarded else None,
        "wall_seconds": round(wall, 1),
        "stderr": [line for line in done.stderr.splitlines() if line.strip()][-6:],
    }


def eligible(run: dict[str, Any]) -> bool:
    """Counted by the goal: at most 3 files, and neither already in the release nor refused
    because it cannot apply to it."""
    if run["files"] > 3 or run["outcome"] == "already present":
        return False
    return not (run["outcome"] == "refused" and _NOT_APPLICABLE.search(run["reason"]))


def summary(runs: list[dict[str, Any]], size: int) -> dict[str, Any]:
    eligible = [run for run in runs if run["eligible"]]
    proven = [run for run in eligible if run["outcome"] == "proven"]
    walls = [run["wall_seconds"] for run in runs]
    return {
        "corpus": size,
        "run": len(runs),
        "outcomes": {
            o: sum(r["outcome"] == o for r in runs)
            for o in ("proven", "already present", "refused")
        },
        "eligible": len(eligible),
        "eligible_proven": len(proven),
        "median_wall_seconds": statistics.median(walls) if walls else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--prs", nargs="+", type=int)
    parser.add_argument("--limit", type=int, help="the first K not yet run (fewest files first)")
    parser.add_argument("--list", action="store_true", help="print the corpus and stop")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/from_pr_corpus.json")
    args = parser.parse_args(argv)
    prs = corpus(args.mirror)
    if args.list:
        for entry in prs:
            print(f"#{entry['pr']:5} {entry['files']:3} files  {entry['subject'][:90]}")
        print(f"{len(prs)} pull requests")
        return {"corpus": prs}
    held: dict[int, dict[str, Any]] = {}
    if args.out.is_file():
        in_corpus = {entry["pr"] for entry in prs}  # a run of a number since corrected drops
        runs_held = json.loads(args.out.read_text())["runs"]
        held = {run["pr"]: run for run in runs_held if run["pr"] in in_corpus}
    todo = [e for e in prs if (args.prs is None or e["pr"] in args.prs)]
    if args.limit is not None:
        todo = sorted((e for e in todo if e["pr"] not in held), key=lambda e: e["files"])
        todo = todo[: args.limit]
    started, code = now(), git_state(code_folder())
    scratch = Path(tempfile.mkdtemp(prefix="bench-from-pr-corpus-"))
    try:
        clone = scratch / "Megatron-LM"
        subprocess.run(["git", "clone", "--quiet", str(args.mirror), str(clone)], check=True)
        for entry in todo:
            run = _one(entry, args.python, clone, scratch)
            run["code_commit"] = code.get("commit")  # runs held from earlier calls keep theirs
            held[run["pr"]] = run
            print(
                f"#{run['pr']}: {run['outcome']} in {run['wall_seconds']} s: {run['reason'][:150]}",
                flush=True,
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for run in held.values():
        run["eligible"] = eligible(run)
    order = [e["pr"] for e in prs]
    runs = sorted(held.values(), key=lambda r: order.index(r["pr"]))
    report = {
        "what": "backports new --from-pr over the 0.19 cycle fixes (benchmarks/from_pr_corpus.py)",
        "provenance": {
            "date": started,
            "finished": now(),
            "machine": machine(),
            "code": code,
            "megatron_core": _installed(args.python),
            "range": [BRANCH_POINT_0_18, BRANCH_POINT_0_19],
        },
        "summary": summary(runs, len(prs)),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report["summary"]))
    return report


if __name__ == "__main__":
    main()
