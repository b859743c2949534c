"""PEP 829: the start-up hook's ``.start`` file (Python 3.15+) beside its ``.pth`` file.

No Python 3.15 is available here, so site's processing of a site dir is played by
``_site_as_pep_829``, written from the PEP (not from our code): ``.start`` entry points are
``pkg.mod:callable`` names resolved with ``pkgutil.resolve_name`` and called with no
argument; a ``<name>.pth`` with a matching ``<name>.start`` has its import lines turned off.
Run on a real 3.15 interpreter: not done.
"""

import os
import pkgutil
import sys
from pathlib import Path

import pytest

import backports.megatron as package
from backports.megatron.job import hook_file
from backports.megatron.job import startup_hook as job_start
from backports.megatron.job.hook_file import HOOK_FILE, START_FILE
from tests.conftest import BACKPORT_ID


@pytest.fixture
def meta_path(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """This process's ``sys.meta_path`` for the test: a trigger installed here goes with it."""
    path = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", path)
    return path


def _triggers(meta_path: list[object]) -> list[tuple[frozenset[str], dict[str, object]]]:
    return [(f.packages, f.config) for f in meta_path if getattr(f, package._TRIGGER, False)]


def _site_as_pep_829(site_dir: Path, python: tuple[int, int]) -> None:
    """What ``site`` does with the hook files of ``site_dir`` on Python ``python``."""
    starts = {p.stem for p in site_dir.glob("*.start")} if python >= (3, 15) else set()
    for pth in sorted(site_dir.glob("*.pth")):
        if pth.stem in starts:
            continue  # a matching .start file turns its import lines off
        for line in pth.read_text().splitlines():
            if line.startswith(("import ", "import\t")):
                exec(line)
    for name in sorted(starts):
        for line in (site_dir / f"{name}.start").read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                pkgutil.resolve_name(line.strip())()


@pytest.mark.parametrize(
    ("only", "strict"), [(None, False), ((BACKPORT_ID,), True), ((), False)], ids=str
)
@pytest.mark.parametrize("python", [(3, 12), (3, 15)], ids=lambda v: f"{v[0]}.{v[1]}")
def test_exactly_one_hook_runs_and_both_start_the_same_trigger(
    tmp_path, monkeypatch, meta_path, only, strict, python
):
    job_start.write_hook(tmp_path, only, strict)
    monkeypatch.syspath_prepend(str(tmp_path))  # site adds a site dir to sys.path first
    calls = []
    real = package._start_up

    def counted(packages, config):
        calls.append((packages, config))
        return real(packages, config)

    monkeypatch.setattr(package, "_start_up", counted)  # the .pth line and the entry point
    _site_as_pep_829(tmp_path, python)
    expected = (frozenset(job_start.watched_packages(only)), {"strict": strict, "only": only})
    assert len(calls) == 1 and _triggers(meta_path) == [expected]


def test_the_start_file_names_one_entry_point_in_the_colon_form(tmp_path):
    job_start.write_hook(tmp_path)
    lines = (tmp_path / START_FILE).read_text().splitlines()
    entries = [line for line in lines if line.strip() and not line.startswith("#")]
    assert entries == ["backports.megatron:_start_up_from_start_file"]
    assert pkgutil.resolve_name(entries[0]) is package._start_up_from_start_file
    assert Path(START_FILE).stem == Path(HOOK_FILE).stem  # what makes the two "matching"
    assert package._START_FILE == START_FILE  # the entry point reads what apply writes


def test_the_entry_point_reads_the_first_start_file_on_an_absolute_path(
    tmp_path, monkeypatch, meta_path
):
    first, second, relative = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (first, second, relative):
        folder.mkdir()
    job_start.write_hook(first, (BACKPORT_ID,))
    job_start.write_hook(second, None, strict=True)
    job_start.write_hook(relative, ())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["c", str(first), str(second), *sys.path])
    package._start_up_from_start_file()
    assert _triggers(meta_path) == [
        (frozenset({"megatron"}), {"strict": False, "only": (BACKPORT_ID,)})
    ]
    (first / START_FILE).unlink()
    package._start_up_from_start_file()
    # Every entry: megatron-lm-5976 also watches the megatron-fsdp wheel's megatron_fsdp.
    every = frozenset({"megatron", "megatron_fsdp"})
    assert _triggers(meta_path) == [(every, {"strict": True, "only": None})]


def test_the_entry_point_without_a_start_file_or_switched_off_starts_nothing(
    tmp_path, monkeypatch, meta_path
):
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert package._start_up_from_start_file() is None and _triggers(meta_path) == []
    job_start.write_hook(tmp_path)
    monkeypatch.setenv("MEGATRON_BACKPORTS", "0")
    assert package._start_up_from_start_file() is None and _triggers(meta_path) == []


def test_a_hook_without_its_start_file_is_stale_and_revert_removes_both(tmp_path):
    job_start.write_hook(tmp_path)
    assert job_start.read_hook(tmp_path).current
    (tmp_path / START_FILE).unlink()  # written by a version before this one
    state = job_start.read_hook(tmp_path)
    assert state.exists and not state.start_exists and not state.current
    state, changed = job_start.write_hook(tmp_path)  # `backports apply` again
    assert changed and job_start.read_hook(tmp_path).current
    before, removed = hook_file.remove_hook(tmp_path)
    assert removed and before.start_exists and sorted(os.listdir(tmp_path)) == []


def test_an_edited_start_file_is_not_current(tmp_path):
    job_start.write_hook(tmp_path, (BACKPORT_ID,))
    path = tmp_path / START_FILE
    path.write_text(path.read_text().replace(f"# only: {BACKPORT_ID}", "# only: *"))
    assert not job_start.read_hook(tmp_path).current
