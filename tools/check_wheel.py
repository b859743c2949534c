"""The wheel is what is tested: build it, install it into a fresh venv, and run it there.

Every test of the suite runs against an editable install of the checkout, so a file missing
from the wheel (a vendored folder, ``py.typed``, a template of ``backports new``) would
pass CI and break every user who installs it. This script (``tools/check-wheel``, run by
``.ci/run``):

1. builds the sdist, then the wheel from the sdist (``python -m build``), and runs
   ``twine check --strict`` on both;
2. makes a fresh venv and installs the wheel into it with ``--no-deps``. torch and
   megatron-core come from the running venv through a ``.pth`` line naming a folder of
   links to its site-packages entries, ours and any plugin's left out: nothing of the
   checkout, and no second megatron-backports, can stand in for the install;
3. checks the install, run from a folder outside the checkout: the package comes from the
   venv, every tracked file of ``backports/megatron/`` and ``vendor/`` is in it,
   ``--version`` is pyproject.toml's version, each vendored folder matches its
   ``UPSTREAM.toml`` (the installed ``backports sync --check --vendor-dir``), ``status`` and
   ``check`` pass, ``backports new`` writes its templates, and ``backports apply`` makes a
   new interpreter that imports megatron get every backport;
4. runs the CLI's process tests (``tests/commands/test_cli_process.py``, copied out of the checkout)
   with the venv's interpreter.

Usage: ``python tools/check_wheel.py [--keep]`` from the project's venv (it needs ``build``,
``twine`` and the test dependencies). Exit 0: all passed; 1: a check failed.
"""

import argparse
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "backports/megatron"
# The process tests that need no source tree: they run `python -m backports.megatron`.
TESTS = ("tests/commands/test_cli_process.py",)


class CheckFailed(RuntimeError):
    """One check of the install failed; the message says which and why."""


def _run(
    argv: Sequence[str | Path], *, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise CheckFailed(
            f"{' '.join(map(str, argv))} exited {done.returncode}\n{done.stdout}{done.stderr}"
        )
    return done


def _step(title: str) -> None:
    print(f"== {title}", flush=True)


def build(work: Path) -> tuple[Path, Path]:
    """The sdist and the wheel built from it (as a user's ``pip install <sdist>`` would)."""
    _step("build the sdist, then the wheel from it; twine check")
    dist = work / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT], cwd=work)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    _run([sys.executable, "-m", "twine", "check", "--strict", sdist, wheel], cwd=work)
    print(f"   {sdist.name}, {wheel.name}: twine check passed")
    return sdist, wheel


def _ours(name: str) -> bool:
    lowered = name.lower()
    return lowered.startswith(("megatron_backports", "backports")) or (
        lowered.startswith("__editable__") and "megatron_backports" in lowered
    )


def _plugins() -> set[str]:
    """The site-packages entries of distributions that register catalog entries (a plugin
    of this venv's, e.g. one `backports new` scaffolded): the wheel is tested alone."""
    names: set[str] = set()
    for entry_point in importlib.metadata.entry_points(group="megatron_backports"):
        if entry_point.dist is not None:
            names.update(Path(str(f)).parts[0] for f in entry_point.dist.files or ())
    return names


def fresh_venv(work: Path, wheel: Path) -> tuple[Path, Path]:
    """(its python, its site-packages): the wheel installed, dependencies linked."""
    _step("a fresh venv: the wheel installed --no-deps, torch and megatron-core linked in")
    root = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=work)
    python = root / "bin" / "python"
    site = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
             cwd=work).stdout.strip()
    )  # fmt: skip
    deps = work / "deps"
    deps.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    plugins = _plugins()
    for entry in ours.iterdir():
        if not _ours(entry.name) and entry.name not in plugins:
            (deps / entry.name).symlink_to(entry, target_is_directory=entry.is_dir())
    (site / "_linked_dependencies.pth").write_text(f"{deps}\n")
    pip: list[str | Path] = [
        sys.executable,
        "-m",
        "pip",
        "--disable-pip-version-check",
        "--python",
        python,
    ]
    _run([*pip, "install", "--quiet", "--no-deps", "--no-index", wheel], cwd=work)
    return python, site


def check_install(python: Path, site: Path, work: Path) -> None:
    """The package, its files and its version, as installed."""
    _step("the install: origin, files, version")
    probe = (
        "import backports.megatron as m, importlib.metadata as md, json; "
        "print(json.dumps([m.__file__, md.version('megatron-backports'), "
        "[d.metadata['Name'] for d in md.distributions() "
        "if d.metadata['Name'] == 'megatron-backports']]))"
    )
    origin, version, copies = json.loads(_run([python, "-I", "-c", probe], cwd=work).stdout)
    if not Path(origin).is_relative_to(site):
        raise CheckFailed(f"backports.megatron comes from {origin}, not from {site}")
    if len(copies) != 1:
        raise CheckFailed(f"{len(copies)} megatron-backports distributions visible, not 1")
    tracked = _run(["git", "ls-files", PACKAGE, "vendor"], cwd=ROOT).stdout.split()
    missing = [f for f in tracked if not (site / _installed_path(f)).is_file()]
    if missing:
        raise CheckFailed(f"missing from the wheel: {', '.join(missing)}")
    expected = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = _run([python, "-m", "backports.megatron", "--version"], cwd=work).stdout.strip()
    if version != expected or shown != f"megatron-backports {expected}":
        raise CheckFailed(f"version {version!r} / --version {shown!r}, not {expected!r}")
    print(f"   {origin}\n   {len(tracked)} tracked files present; {shown}")


def _installed_path(tracked: str) -> str:
    """Where a tracked file of the checkout lands in site-packages."""
    if tracked.startswith("vendor/"):
        return f"{PACKAGE}/_vendor/{tracked.removeprefix('vendor/')}"
    return tracked


def check_vendored(python: Path, site: Path, work: Path) -> None:
    _step("the installed vendored folders match their UPSTREAM.toml")
    vendor = site / PACKAGE / "_vendor"
    folders = sorted(p.parent.name for p in vendor.glob("*/UPSTREAM.toml"))
    in_checkout = sorted(p.parent.name for p in (ROOT / "vendor").glob("*/UPSTREAM.toml"))
    if folders != in_checkout:
        raise CheckFailed(f"vendored folders installed {folders}, in the checkout {in_checkout}")
    sync: list[str | Path] = [python, "-m", "backports.megatron", "sync"]  # installed
    done = _run([*sync, "--check", "--vendor-dir", vendor], cwd=work)
    print(f"   {', '.join(folders)}: {done.stdout.strip().splitlines()[-1]}")


def check_commands(python: Path, work: Path) -> None:
    """status, check, new, and apply: the hook reaches a new interpreter."""
    backports: list[str | Path] = [python, "-m", "backports.megatron"]
    _step("backports status / check")
    _run([*backports, "status", "--strict"], cwd=work)
    print("   " + _run([*backports, "check"], cwd=work).stdout.strip().splitlines()[-1])
    _step("backports new: its templates")
    dest = work / "plugin"
    _run(
        [*backports, "new", "--id", "acme-1", "--pr", "1", "--repo",
         "https://github.com/NVIDIA/Megatron-LM.git", "--target", "megatron.core.utils:divide",
         "--dest", dest],
        cwd=work,
    )  # fmt: skip
    written = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    if not any(name.endswith("pyproject.toml") for name in written) or len(written) < 5:
        raise CheckFailed(f"backports new wrote only {written}")
    print(f"   {len(written)} files: {', '.join(written)}")
    _step("backports apply: a new interpreter that imports megatron gets every backport")
    applied = json.loads(_run([*backports, "apply", "--json"], cwd=work).stdout)
    wanted = sorted(r["id"] for r in applied if r["action"] == "installed")
    try:
        # The last line: megatron.training's import (#6321's target) points the root logger
        # at stdout (logging.basicConfig), so log lines may come before it.
        printed = _run([python, "-c", _IMPORTS_MEGATRON], cwd=work).stdout.strip().splitlines()
        got = sorted(json.loads(printed[-1]))
    finally:
        _run([*backports, "revert"], cwd=work)
    if not wanted or got != wanted:
        raise CheckFailed(f"the hook installed {got} in a new interpreter, apply {wanted}")
    print(f"   installed by the hook at import: {', '.join(got)}")


# Imports each target's module, as a training job would, and names what the hook installed.
_IMPORTS_MEGATRON = """
import importlib, json
from backports.megatron.catalog import entries
from backports.megatron.job.ranks import installed_backports
for spec in entries():
    for target in spec.targets:
        for name in target.modules:
            try:
                importlib.import_module(name)
            except ImportError:
                continue
            break
# Replacements and import guards alike (#6964 guards a module's execution, not an attribute).
print(json.dumps(sorted(installed_backports())))
"""


def run_tests(python: Path, work: Path) -> None:
    _step(f"tests against the install: {', '.join(TESTS)}")
    suite = work / "suite"
    shutil.copytree(ROOT / "tests", suite / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(ROOT / "pyproject.toml", suite / "pyproject.toml")  # markers, filterwarnings
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = _run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS], cwd=suite, env=env
    )
    print("   " + done.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="check-wheel-"))
    try:
        _sdist, wheel = build(work)
        python, site = fresh_venv(work, wheel)
        check_install(python, site, work)
        check_vendored(python, site, work)
        check_commands(python, work)
        run_tests(python, work)
    except CheckFailed as exc:
        print(f"check-wheel: FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)
    print("check-wheel: the wheel passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
