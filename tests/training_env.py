"""Throwaway training environments: a venv with megatron-backports pip-installed into it.

What a user has after ``pip install megatron-backports`` in the venv that holds torch and
megatron-core: the package is a regular (non-editable) install in the venv's
site-packages, ``bin/backports`` is its console script, and every interpreter of the venv
processes that site-packages' ``.pth`` files at start-up. torch and megatron-core come
from the test interpreter's environment through a ``.pth`` path line (installing them
again would take minutes); such a line only extends ``sys.path``, so that environment's
own ``.pth`` files (an editable install of this repository, say) stay out.
"""

import os
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

    @property
    def hook(self) -> Path:
        return self.site_packages / HOOK_FILE

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED}
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


def create(root: Path, *, install: bool = True) -> TrainingEnv:
    """A venv at ``root`` seeing this environment's packages, with this repo installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site_packages = _purelib(python)
    base = dict.fromkeys(_base_paths())
    (site_packages / "_base_environment.pth").write_text("\n".join(base) + "\n")
    env = TrainingEnv(root, python, site_packages)
    if install:
        source = _copy_source(root / "src")
        done = env.run(
            [
                "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                "--no-build-isolation", "--ignore-installed", "--no-cache-dir", str(source),
            ],
            timeout=600,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"pip install failed:\n{done.stdout}\n{done.stderr}")
        shutil.rmtree(source)
    return env
