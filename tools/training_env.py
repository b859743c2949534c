"""Throwaway training environments: a venv with megatron-backports pip-installed into it.

What a user has after ``pip install megatron-backports`` in the venv that holds torch and
megatron-core: the package is a regular (non-editable) install in the venv's
site-packages, ``bin/backports`` is its console script, and every interpreter of the venv
processes that site-packages' ``.pth`` files at start-up. torch and megatron-core come
from the test interpreter's environment through a ``.pth`` path line (installing them
again would take minutes); such a line only extends ``sys.path``, so that environment's
own ``.pth`` files (an editable install of this repository, say) stay out. The start-up
benchmark also builds the two other layouts ``create`` knows: packages linked into the
venv's own site-packages (one folder, as pip leaves it), and a bare venv.
"""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TILELANG_DSA = "megatron.core.transformer.experimental_attention_variant.ops.tilelang_dsa"
HOOK_FILE = "megatron_backports_startup.pth"

# Variables that would change what the child does behind the test's back.
_SCRUBBED = (
    "PYTHONPATH",
    "MEGATRON_BACKPORTS",
    "MEGATRON_BACKPORTS_SKIP",
    "MEGATRON_BACKPORTS_SKIP_PLUGINS",
    "MEGATRON_BACKPORTS_SAID",
    "MEGATRON_BACKPORTS_CACHE",
    "MEGATRON_BACKPORTS_CACHE_DIR",
    "RANK",
    "LOCAL_RANK",
)


def _copy_source(into: Path) -> Path:
    """The repository as an sdist would have it: no venvs, caches or build output."""

    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder) == REPO
        return {
            n
            for n in names
            if n == "__pycache__"
            or n.endswith(".egg-info")
            or (top and (n.startswith(".") or n in {"build", "dist", "benchmarks"}))
        }

    shutil.copytree(REPO, into, ignore=ignore)
    return into


@dataclass(frozen=True)
class TrainingEnv:
    root: Path
    python: Path
    site_packages: Path
    # Set in every process this venv runs, after the scrub (a test's own switches).
    always: tuple[tuple[str, str], ...] = ()

    @property
    def hook(self) -> Path:
        return self.site_packages / HOOK_FILE

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
        env.update(self.always)
        env.update(extra or {})
        return env

    def run(
        self,
        args: Sequence[str],
        *,
        extra_env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        timeout: float = 300,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``args`` (``python`` and ``backports`` mean this venv's) and capture output."""
        first = {"python": str(self.python), "backports": str(self.root / "bin" / "backports")}
        command = [first.get(args[0], args[0]), *args[1:]]
        return subprocess.run(
            command,
            env=self.env(extra_env),
            cwd=cwd or self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def _purelib(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def _base_paths() -> list[str]:
    """This interpreter's site-packages, and the package folders its own ``.pth`` lines add
    (a venv layered on another venv's packages through a path line, as a worktree's is)."""
    paths = sysconfig.get_paths()
    added = [p for p in sys.path if Path(p).name == "site-packages" and Path(p).is_dir()]
    return list(dict.fromkeys([paths["purelib"], paths["platlib"], *added]))


def _ours(name: str) -> bool:
    """An entry of this distribution (an editable install of it, say) or of its hook."""
    lowered = name.lower()
    return (
        lowered.startswith(("megatron_backports", "__editable__"))
        or lowered == "backports"  # a namespace folder: pip would write through a link
        or name in (HOOK_FILE, "_base_environment.pth", "__pycache__")
    )


def _runtime_requirements() -> set[str]:
    """Import names of what megatron-backports needs to run (``packaging``), not extras."""
    requires = importlib.metadata.requires("megatron-backports") or []
    return {
        re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower() for r in requires if "extra" not in r
    }


def _link_packages(site_packages: Path, only: set[str] | None = None) -> None:
    """Link entries of this environment's site-packages into ``site_packages``: all of them
    (one folder holding torch, megatron-core and setuptools, whose ``distutils-precedence.pth``
    runs at every start-up, as in any venv where pip installed torch, as pip leaves it), or
    ``only`` the named distributions (their package folder and ``.dist-info``)."""
    for base in _base_paths():
        for entry in sorted(Path(base).iterdir()):
            link = site_packages / entry.name
            wanted = only is None or entry.name.lower().split("-")[0] in only
            if wanted and not _ours(entry.name) and not link.exists():
                link.symlink_to(entry, target_is_directory=entry.is_dir())


def create(
    root: Path,
    *,
    install: bool = True,
    packages: str = "path-line",
    editable: bool = False,
    always: Mapping[str, str] | None = None,
) -> TrainingEnv:
    """A venv at ``root`` seeing this environment's packages, with this repo installed.

    ``editable``: ``pip install -e`` of a copy of this repository (kept at ``root/src``).

    ``always``: variables set in every process the venv runs (``TrainingEnv.run``).

    ``packages`` says how: ``"path-line"`` (a ``.pth`` line adds this environment's
    site-packages to ``sys.path``; their ``.pth`` files stay out), ``"linked"`` (each entry
    linked into the venv's own site-packages, ``.pth`` files included), or ``"none"`` (a
    bare venv: this repository, installed from a wheel built here, and ``packaging``).
    """
    if packages not in ("path-line", "linked", "none"):
        raise ValueError(f"packages must be path-line, linked or none, not {packages!r}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site_packages = _purelib(python)
    if packages == "path-line":
        base = dict.fromkeys(_base_paths())
        (site_packages / "_base_environment.pth").write_text("\n".join(base) + "\n")
    else:
        _link_packages(site_packages, None if packages == "linked" else _runtime_requirements())
    env = TrainingEnv(root, python, site_packages, tuple((always or {}).items()))
    if install and packages == "none":
        _install_wheel(env)
        return env
    if install:
        source = _copy_source(root / "src")
        done = env.run(
            [
                "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                "--no-build-isolation", "--ignore-installed", "--no-cache-dir",
                *(["-e"] if editable else []), str(source),
            ],
            timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed:\n{done.stdout}\n{done.stderr}")
        if not editable:
            shutil.rmtree(source)
    return env


def _install_wheel(env: TrainingEnv) -> None:
    """Build this repository's wheel here and install it with this pip into ``env``, whose
    interpreter has no pip and no setuptools of its own."""
    source = _copy_source(env.root / "src")
    wheels = env.root / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    quiet = ["--quiet", "--no-deps", "--no-index"]
    _pip(*pip, "wheel", *quiet, "--no-build-isolation", "-w", str(wheels), str(source))
    _pip(*pip, "--python", str(env.python), "install", *quiet, *map(str, wheels.glob("*.whl")))
    shutil.rmtree(source)
    shutil.rmtree(wheels)


def _pip(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}")
