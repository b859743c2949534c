"""Issue 35 item 6: the sniff ``backports new --from-pr`` derives for #6010, #6099 and
#6624 against the handwritten builtin's sniff, on 0.19.2 and on the merged code.

    python benchmarks/from_pr_compare.py SCRATCH [--prs 6010 6099 6624] [--out PATH]

SCRATCH is a folder outside the repository (never committed). Missing pieces are made
there, found there on a rerun: ``Megatron-LM.git``, a ``git clone --mirror`` of the local
mirror of NVIDIA/Megatron-LM; ``plugin-N``, what ``backports new --from-pr N --repo
SCRATCH/Megatron-LM.git --dest SCRATCH/plugin-N`` writes, its output in ``plugin-N.log``
(a refusal is recorded by its last line).

The derivation runs where the builtin of the same pull request does not exist: its proof
refuses a plugin whose targets an enabled builtin also patches ("never installs while
megatron-lm-N does"), and its children drop ``MEGATRON_BACKPORTS_*``, so
``MEGATRON_BACKPORTS_SKIP`` cannot reach them. So ``without-N/`` holds a copy of this
checkout's ``backports.megatron`` (and its vendored folders) less
``catalog/megatron_lm_N.py``, and ``venv-N/`` a bare virtual environment whose only path
file names that copy, then the running interpreter's site-packages (torch, megatron-core;
this checkout's editable finder is a path file there, so it is not read). The derivation
is ``venv-N/bin/python -P -m backports.megatron new --from-pr ...`` with cwd SCRATCH.
A written plugin
is pip-installed (``--no-deps --target SCRATCH/site-N``), then a child interpreter (``-P``,
this folder put on its path explicitly, cwd SCRATCH, that site on ``PYTHONPATH``) runs
four sniffs on the targets resolved as the decision resolves them:

- each entry's sniff on the installed code (0.19.2: both should say not fixed, "needed");
- each on its own merged code: the handwritten entry's vendored code and the derived
  plugin's vendored code, upstream-only, as ``status`` judges them (both should say fixed);

and, beside them, each sniff on the other's vendored code (where it can be built). Writes
``benchmarks/results/from_pr_vs_handwritten.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")
GITHUB = "https://github.com/NVIDIA/Megatron-LM.git"


def _env(scratch: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    env.pop("PYTHONPATH", None)
    env["MEGATRON_BACKPORTS_CACHE_DIR"] = str(scratch / "verdict-cache")
    env["XDG_CACHE_HOME"] = str(scratch / "xdg-cache")
    env["TMPDIR"] = str(scratch / "tmp")
    (scratch / "tmp").mkdir(exist_ok=True)
    return {**env, **extra}


def _clone(scratch: Path, mirror: Path) -> Path:
    clone = scratch / "Megatron-LM.git"
    if not clone.is_dir():
        subprocess.run(["git", "clone", "--quiet", "--mirror", str(mirror), str(clone)], check=True)
        subprocess.run(["git", "-C", str(clone), "config", "remote.origin.url", GITHUB], check=True)
    return clone


def _without_builtin(number: int, scratch: Path) -> Path:
    """A Python whose ``backports.megatron`` lacks the builtin megatron-lm-N (see above)."""
    import shutil
    import sysconfig

    code = scratch / f"without-{number}"
    package = code / "backports" / "megatron"
    if not package.is_dir():
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "backports" / "megatron", package, ignore=ignore)
        shutil.copytree(ROOT / "vendor", package / "_vendor", ignore=ignore)
        (package / "catalog" / f"megatron_lm_{number}.py").unlink()
    venv = scratch / f"venv-{number}"
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        purelib = subprocess.run(
            [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        here = sysconfig.get_paths()["purelib"]
        Path(purelib, "measure_without_builtin.pth").write_text(f"{code}\n{here}\n")
    return python


def _derive(number: int, clone: Path, scratch: Path) -> dict[str, Any]:
    """The plugin for ``number`` (derived now unless SCRATCH/plugin-N is there)."""
    dest, log = scratch / f"plugin-{number}", scratch / f"plugin-{number}.log"
    if dest.is_dir():
        return {"derived": "earlier (found in the scratch folder)", "written": True}
    python = _without_builtin(number, scratch)
    argv = [str(python), "-P", "-m", "backports.megatron", "new", "--from-pr", str(number)]
    argv += ["--repo", str(clone), "--dest", str(dest)]
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=scratch, env=_env(scratch))
    wall = round(time.monotonic() - start, 1)
    log.write_text(done.stdout + done.stderr)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    result = {
        "derived": "now",
        "environment": f"backports.megatron without catalog/megatron_lm_{number}.py",
        "exit": done.returncode,
        "wall_s": wall,
        "written": dest.is_dir(),
    }
    if done.returncode != 0:
        result["refusal"] = lines[-1] if lines else "(no output)"
    return result


def _install(number: int, scratch: Path) -> Path:
    site = scratch / f"site-{number}"
    if not site.is_dir():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        pip += ["--no-build-isolation", "--target", str(site), str(scratch / f"plugin-{number}")]
        subprocess.run(pip, capture_output=True, text=True, cwd=scratch, check=True)
    return site


def _judged(number: int, site: Path, scratch: Path) -> dict[str, Any]:
    argv = [sys.executable, "-P", str(Path(__file__).resolve()), "--judge", str(number)]
    env = _env(scratch, PYTHONPATH=str(site))
    done = subprocess.run(argv, capture_output=True, text=True, cwd=scratch, env=env)
    if done.returncode != 0:
        tail = [line for line in done.stderr.splitlines() if line.strip()][-1:]
        return {"judge_failed": tail[0] if tail else f"exit {done.returncode}"}
    return dict(json.loads(done.stdout.splitlines()[-1]))


def _outcome(call: Any) -> dict[str, Any]:
    try:
        result = call()
    except Exception as exc:
        return {"verdict": "raised", "summary": " ".join(f"{type(exc).__name__}: {exc}".split())}
    return {"verdict": "fixed" if result.fixed else "not fixed", "summary": result.summary}


def judge(number: int) -> dict[str, Any]:
    """In the child: the four sniffs, and the two across."""
    sys.path.insert(0, str(HERE))
    import _internals

    hand = _internals.by_id(f"megatron-lm-{number}")
    derived = _internals.entry_of_plugin(f"mlm-pr-{number}")
    sniffs: dict[str, Any] = {}
    for name, spec in (("handwritten", hand), ("derived", derived)):
        resolved = _internals.resolve(spec)
        stock = _internals.installed_code(spec, resolved)
        sniffs[name] = {
            "id": spec.id,
            "targets": [t.attribute for t in spec.targets],
            "route": getattr(__import__(spec.sniff.__module__, fromlist=["_"]), "ROUTE", None),
            "installed_0_19_2": _outcome(lambda s=spec, c=stock: s.sniff(c)),
            "own_merged_code": _outcome(
                lambda s=spec, r=resolved: _internals.sniff_on_vendored(s, r)
            ),
        }
    across = {}
    for name, spec, other in (("handwritten", hand, derived), ("derived", derived, hand)):
        across[f"{name} sniff on the other's merged code"] = _outcome(
            lambda s=spec, o=other: _internals.sniff_on_vendored(
                s, _internals.resolve(s), _internals.vendored_code(o)
            )
        )
    h, d = sniffs["handwritten"], sniffs["derived"]
    agree = {
        "installed_0_19_2": h["installed_0_19_2"]["verdict"] == d["installed_0_19_2"]["verdict"],
        "own_merged_code": h["own_merged_code"]["verdict"] == d["own_merged_code"]["verdict"],
    }
    return {"sniffs": sniffs, "agree": agree, "across (supplementary)": across}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("scratch", type=Path, nargs="?")
    parser.add_argument("--prs", nargs="+", type=int, default=[6010, 6099, 6624])
    parser.add_argument("--mirror", type=Path, default=MIRROR)
    parser.add_argument("--judge", type=int, help=argparse.SUPPRESS)  # the child's part
    parser.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks/results/from_pr_vs_handwritten.json"
    )
    args = parser.parse_args()
    if args.judge is not None:
        print(json.dumps(judge(args.judge)))
        return
    if args.scratch is None:
        parser.error("the scratch folder is required")
    sys.path.insert(0, str(HERE))
    import _provenance

    scratch = args.scratch.resolve()
    if scratch.is_relative_to(ROOT):
        parser.error("the scratch folder must be outside the repository")
    scratch.mkdir(parents=True, exist_ok=True)
    code = _provenance.code_folder()
    git = _provenance.git_state(code)
    started, load_before = _provenance.now(), _provenance.load_average()
    clone = _clone(scratch, args.mirror)
    mirror_main = subprocess.run(
        ["git", "-C", str(clone), "rev-parse", "refs/heads/main"], capture_output=True, text=True
    ).stdout.strip()
    results = []
    for number in args.prs:
        row: dict[str, Any] = {"pr": number, **_derive(number, clone, scratch)}
        if row["written"]:
            row.update(_judged(number, _install(number, scratch), scratch))
        results.append(row)
        agree = row.get("agree", {})
        print(f"#{number}: written {row['written']}, agree {agree or row.get('refusal')}")
    result = {
        "what": "backports new --from-pr's derived sniff against the handwritten entry's, "
        "on megatron-core 0.19.2 (installed code) and on the merged code (each one's "
        "vendored code, upstream-only); verdict = what the sniff says of that code",
        "date": started,
        "machine": {
            **_provenance.machine(),
            "load_average_before": load_before,
            "load_average_after": _provenance.load_average(),
            "note": "2 cores shared with other engineers' test runs",
        },
        "code": str(code),
        "git": git,
        "megatron_core": _provenance.megatron_core_version(),
        "mirror_main": mirror_main,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
