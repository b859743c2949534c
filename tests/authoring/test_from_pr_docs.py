"""docs/from-pr.md's walk-through, run as written, against the fixture repository.

The commands run in bash, in a throwaway venv that holds this repository as a user installs
it (tools/training_env.py), from a folder of this test's: ``backports new --from-pr`` with
``PR`` and ``CLONE`` set to the fixture's #101 and its path, the pip install of the plugin
it wrote, ``status`` and ``check``. pip is kept offline here (``PIP_NO_INDEX``, no build
isolation: the plugin's requirements are all installed already)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.from_pr_fixture import build
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env

DOC = ROOT / "docs" / "from-pr.md"
MARK = "<!-- from-pr walk-through: run in tests/authoring/test_from_pr_docs.py -->"


def walk_through() -> list[str]:
    """The commands of the fenced block under the marker."""
    text = DOC.read_text(encoding="utf-8")
    block = re.search(re.escape(MARK) + r"\n```bash\n(.*?)\n```", text, re.S)
    assert block is not None, "docs/from-pr.md lost its walk-through block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_walk_through_is_the_four_commands() -> None:
    commands = walk_through()
    assert commands[0].startswith("backports new --from-pr")
    assert commands[-1] == "backports check"


def test_the_walk_through_names_a_pull_request_no_builtin_carries() -> None:
    """A builtin ``megatron-lm-N`` installs first on #N's targets: the plugin of the doc's
    example would never run, and its last ``backports check`` would fail."""
    from backports.megatron.catalog import entries

    text = DOC.read_text(encoding="utf-8")
    named = re.search(r"for example `PR=(\d+)`", text)
    printed = re.search(r"What it printed for #(\d+)", text)
    assert named is not None and printed is not None
    assert named.group(1) == printed.group(1)
    builtins = {spec.id for spec in entries()}
    assert f"megatron-lm-{named.group(1)}" not in builtins, builtins


@pytest.mark.slow
def test_the_walk_through_runs_from_a_pull_request_to_a_passing_check(tmp_path: Path) -> None:
    upstream = build(tmp_path / "Megatron-LM")
    env = training_env.create(tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    script = "set -euo pipefail\n" + "\n".join(walk_through()) + "\n"
    extra = {
        "PR": "101",
        "CLONE": str(upstream.path),
        "PATH": f"{env.root / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "MEGATRON_BACKPORTS_CACHE_DIR": str(tmp_path / "verdict-cache"),
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads it inverted: build in this environment
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=work,
        env=env.env(extra),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "wrote mlm-pr-101-backport" in done.stdout
    assert re.search(r"mlm-pr-101\s+needed", done.stdout), done.stdout[-3000:]
    assert "check: all" in done.stdout and "backports ok" in done.stdout
    assert (work / "mlm-pr-101-backport" / "pyproject.toml").is_file()
