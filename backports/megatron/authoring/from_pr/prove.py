"""Step six: prove the staged plugin, installed where nothing else sees it.

``pip install --no-deps --no-build-isolation --no-index --target`` puts it in a folder of
the scratch space (never this environment); children with that folder on ``PYTHONPATH``
then run the contract kit (its sniff says needed on the installed megatron-core and fixed
on the vendored code, upstream-only too; apply/revert; the hashes; a reload),
``backports check --only ID`` (must exit 0) and ``backports upstream-tests`` (run where
the recorded tests can run here; what it says is reported as it is, not required).
"""

from pathlib import Path

from .child import package_root, run_command, run_module
from .errors import NotProven


class Proof(list[str]):
    """One line per check, as run."""


def _install(staging: Path, site: Path, scratch: Path) -> None:
    argv = ["-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index"]
    argv += ["--quiet", "--disable-pip-version-check", "--target", str(site), str(staging)]
    done = run_command(argv, scratch / "pip", [], timeout=600)
    if done.returncode != 0:
        raise NotProven(
            f"pip could not install the plugin (exit {done.returncode}): {done.last_line()}"
        )


def _contract(backport_id: str, paths: list[Path], scratch: Path, proof: Proof) -> None:
    answer, done = run_module(
        "backports.megatron.authoring.from_pr.prove_child",
        {"id": backport_id},
        scratch / "contract",
        paths,
        timeout=900,
        inherited=True,
    )
    if answer is None or "error" in answer:
        why = (answer or {}).get("error") or done.last_line()
        raise NotProven(f"the contract kit could not run: {why}")
    failed = []
    for name, outcome in answer["checks"].items():
        proof.append(f"contract {name}: {outcome}")
        if outcome != "ok":
            failed.append(f"{name}: {outcome}")
    if failed:
        raise NotProven(f"the contract kit fails: {failed[0]}")


def _check(backport_id: str, paths: list[Path], scratch: Path, proof: Proof) -> None:
    argv = ["-m", "backports.megatron", "check", "--only", backport_id]
    done = run_command(argv, scratch / "check", paths, timeout=600)
    proof.append(
        f"backports check --only {backport_id}: exit {done.returncode} ({done.seconds:.1f} s)"
    )
    if done.returncode != 0:
        raise NotProven(f"backports check fails with the plugin installed: {done.last_line()}")


def upstream_tests(backport_id: str, clone: Path, paths: list[Path], scratch: Path) -> list[str]:
    """What ``backports upstream-tests`` says, as it says it (rows, notes, its verdict)."""
    argv = ["-m", "backports.megatron", "upstream-tests", backport_id, "--repo", str(clone)]
    done = run_command(argv, scratch / "upstream-tests", paths, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    if done.returncode == 2:  # it could not run at all: its one-line reason is on stderr
        lines += [line for line in done.stderr.splitlines() if line.startswith("backports")]
    return [*lines[-24:], f"(exit {done.returncode}, {done.seconds:.1f} s)"]


def prove(backport_id: str, staging: Path, scratch: Path) -> tuple[Proof, list[Path]]:
    """Install, run the contract and ``check``; ``NotProven`` at the first that fails.
    Returns the lines and the ``PYTHONPATH`` the plugin is installed on."""
    site = scratch / "site"
    _install(staging, site, scratch)
    proof = Proof(["installed with pip --target into a scratch folder (not this environment)"])
    paths = [package_root(), site]
    _contract(backport_id, paths, scratch, proof)
    _check(backport_id, paths, scratch, proof)
    return proof, paths
