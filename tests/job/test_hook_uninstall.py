"""The start-up hook after ``pip uninstall megatron-backports``: silent, for every kind of install.

A wheel's uninstall removes the package's ``__init__.py``, which the hook line checks for.
An editable install's files stay in the checkout: there the line must also see that pip
removed the distribution's metadata, or every ``python -c pass`` prints a traceback.
"""

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

import backports.megatron
from backports.megatron.job import hook_file
from backports.megatron.job import startup_hook as job_start
from tests.paths import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import training_env


def _hook_line() -> str:
    return next(line for line in job_start.hook_text().splitlines() if line.startswith("import"))


class _Distribution:
    """megatron-backports as installed into ``site_dir`` (its metadata's home)."""

    version = "9.9"

    def __init__(self, site_dir: Path) -> None:
        self.site_dir = site_dir

    def locate_file(self, path: str) -> Path:
        return self.site_dir / path


def test_an_editable_install_s_hook_line_needs_its_metadata(monkeypatch, tmp_path):
    metadata = tmp_path / "megatron_backports-9.9.dist-info"
    metadata.mkdir()
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _Distribution(tmp_path))
    line = _hook_line()
    calls: list[tuple] = []
    monkeypatch.setattr(backports.megatron, "_start_up", lambda *args: calls.append(args))
    exec(line)
    assert len(calls) == 1  # installed: the line starts the trigger
    metadata.rmdir()  # `pip uninstall`: the checkout's files stay, the metadata goes
    exec(line)
    assert len(calls) == 1


def test_a_site_install_s_hook_line_checks_its_files_alone(monkeypatch):
    package_site = Path(backports.megatron.__file__).parents[2]
    monkeypatch.setattr(
        importlib.metadata, "distribution", lambda name: _Distribution(package_site)
    )
    assert "os.listdir" not in _hook_line()  # no cost at start-up where none is needed


def test_the_line_stays_silent_where_the_package_cannot_be_imported(monkeypatch, tmp_path):
    """An interpreter that cannot import our package (the editable finder gone) runs the
    hook file: no output, although another ``backports.*`` distribution (backports.tarfile,
    which twine pulls in) makes ``backports`` findable. The control: with the metadata
    there, the import is tried and fails loudly."""
    metadata = tmp_path / "megatron_backports-9.9.dist-info"
    (tmp_path / "backports").mkdir()
    (tmp_path / "backports" / "tarfile.py").write_text("")
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: _Distribution(tmp_path))
    (tmp_path / hook_file.HOOK_FILE).write_text(_hook_line() + "\n")
    # -I -S: no site-packages, so no finder that could import backports.megatron.
    run = [sys.executable, "-I", "-S", "-c", f"import site; site.addsitedir({str(tmp_path)!r})"]
    done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    metadata.mkdir()  # the control: metadata there, the import is tried and fails loudly
    done = subprocess.run(run, capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "ModuleNotFoundError" in done.stderr


@pytest.mark.slow
def test_leftover_hook_after_uninstalling_an_editable_install_is_silent(tmp_path):
    venv = training_env.create(tmp_path / "venv", editable=True)
    done = venv.run(["backports", "apply", "--only", "megatron-lm-7617"])
    assert done.returncode == 0, done.stdout + done.stderr
    done = venv.run(["python", "-m", "pip", "uninstall", "-y", "-q", "megatron-backports"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert (venv.site_packages / hook_file.HOOK_FILE).exists()
    done = venv.run(["python", "-c", "pass"])
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
