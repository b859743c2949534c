"""``backports audit`` tells "could not probe the candidate here" from "does not fit" (issue 36.1).

A candidate this environment cannot probe (its megatron.core needs torch and there is none,
a target imports a module missing here, the probing interpreter dies before it reports)
exits 2 with one line naming what is missing, and prints no row at all: a pin-bump gate
must not pass, nor call a backport "update or delete", on a probe that never ran. Each case
has its control: the same candidate where it can be probed, or a failure that is the
candidate's own (still ``incompatible``).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import packaging
import pytest

from backports.megatron import cli, exit_status
from tests.paths import ROOT

pytestmark = pytest.mark.slow

ROUTER = "megatron/core/transformer/moe/router.py"  # #6114's target module


def _candidate(folder: Path, files: dict[str, str]) -> Path:
    """A site-packages folder holding a megatron-core 0.19.2 made of ``files``."""
    for name, text in {"megatron/__init__.py": "", **files}.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in path.relative_to(folder).parents:
            if str(package) != "." and not (folder / package / "__init__.py").exists():
                (folder / package / "__init__.py").touch()
        path.write_text(text)
    info = folder / "megatron_core-0.19.2.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.19.2\n")
    return folder


@pytest.fixture(scope="module")
def python_without_torch(tmp_path_factory) -> Path:
    """A real venv with this checkout and packaging on its path, and no torch."""
    root = tmp_path_factory.mktemp("no-torch")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    extra = root / "extra"
    extra.mkdir()
    (extra / "packaging").symlink_to(Path(packaging.__file__).parent)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "backports_under_test.pth").write_text(f"{ROOT}\n{extra}\n")
    python = venv / "bin" / "python"
    probe = subprocess.run([python, "-c", "import torch"], capture_output=True, check=False)
    assert probe.returncode != 0  # the premise: no torch there
    return python


def _audit_in(python: Path | str, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    scrubbed = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    return subprocess.run(
        [python, "-P", "-m", "backports.megatron", "audit", *argv],
        env=scrubbed,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.parametrize("flags", [[], ["--fail-on-landed"], ["--json"]], ids=str)
def test_a_candidate_needing_torch_in_a_venv_without_it_is_exit_2(
    python_without_torch, tmp_path, flags
):
    candidate = _candidate(tmp_path / "candidate", {"megatron/core/__init__.py": "import torch\n"})
    done = _audit_in(python_without_torch, tmp_path, "--dir", str(candidate), *flags)
    assert (done.returncode, done.stdout) == (exit_status.CANNOT_RUN, "")
    assert done.stderr == (
        f"backports: cannot probe {candidate} here: this environment lacks torch, which its "
        "megatron.core imports; install it (or audit from an environment that has it)\n"
    )


def test_the_same_candidate_where_torch_is_is_probed(tmp_path):
    """The control: here torch imports, the candidate's megatron.core too, and each target
    is simply not in it."""
    candidate = _candidate(tmp_path / "candidate", {"megatron/core/__init__.py": "import torch\n"})
    done = _audit_in(sys.executable, tmp_path, "--dir", str(candidate), "--json")
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    assert rows["megatron-lm-6114"]["verdict"] == "absent"


def _audit(capsys, candidate: Path) -> tuple[int, list[dict], str]:
    code = cli.main(["audit", "--json", "--dir", str(candidate), "--only", "megatron-lm-6114"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else [], err


def test_a_target_importing_a_module_missing_here_is_exit_2_naming_it(tmp_path, capsys):
    router = "import backports_test_absent_dependency\n"
    candidate = _candidate(tmp_path, {"megatron/core/__init__.py": "", ROUTER: router})
    code, rows, err = _audit(capsys, candidate)
    assert (code, rows) == (exit_status.CANNOT_RUN, [])
    assert err == (
        f"backports: cannot probe {candidate} here: this environment lacks "
        "backports_test_absent_dependency (imported by the targets of megatron-lm-6114); "
        "install it, or leave those backports out with --only\n"
    )


def test_a_target_importing_what_its_own_release_lacks_still_does_not_fit(tmp_path, capsys):
    """The control: the module missing is the candidate's own (megatron.*): the candidate is
    probed, and the backport is incompatible with it, as before."""
    router = "import megatron.core.not_in_this_release\n"
    candidate = _candidate(tmp_path, {"megatron/core/__init__.py": "", ROUTER: router})
    code, (row,), err = _audit(capsys, candidate)
    assert code == 0 and err == ""
    assert (row["verdict"], row["outcome"]) == ("incompatible", "does not fit: update or delete")
    assert "megatron.core.not_in_this_release" in row["reason"]


def test_a_probing_interpreter_that_dies_first_is_exit_2_in_one_line(tmp_path, capsys):
    dies = "import os\nos._exit(3)\n"
    candidate = _candidate(tmp_path, {"megatron/core/__init__.py": dies})
    code, rows, err = _audit(capsys, candidate)
    assert (code, rows) == (exit_status.CANNOT_RUN, [])
    assert err.count("\n") == 1 and "cannot probe" in err and "(exit 3)" in err
