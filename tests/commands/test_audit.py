"""``backports audit``: probe a candidate megatron-core without installing it.

The real 0.18.2 and 0.19.2 wheels come from the package index (cached under pytest's
cache folder); a folder with a behaviourally fixed megatron-core stand-in plays the
release that merged #7617.
"""

import importlib.util
import json
import subprocess
import sys
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest

from backports.megatron import cli
from backports.megatron.catalog import CATALOG
from backports.megatron.commands import _candidate
from tests.conftest import BACKPORT_ID, TILELANG_DSA, builtin_rows
from tests.reports import report_for

pytestmark = pytest.mark.slow

VENDORED = files("backports.megatron._vendor.megatron_lm_7617") / "tilelang_dsa.py"
_NETWORK_ERRORS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeout",
    "Read timed out",
    "ProxyError",
    "Max retries exceeded",
    "No matching distribution found",  # what an unreachable index ends with, after retries
)


def _wheel(request: pytest.FixtureRequest, version: str) -> Path:
    pytest_cache = getattr(request.config, "cache", None)  # absent: -p no:cacheprovider
    if pytest_cache is not None:
        cache = Path(pytest_cache.mkdir("megatron-core-wheels"))
    else:
        cache = request.getfixturevalue("tmp_path_factory").mktemp("megatron-core-wheels")
    found = sorted(cache.glob(f"megatron_core-{version}-*.whl"))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--retries", "1", "--timeout", "20"]
    command += ["--dest", str(cache), f"megatron-core=={version}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    found = sorted(cache.glob(f"megatron_core-{version}-*.whl"))
    if done.returncode == 0 and found:
        return found[0]
    output = done.stdout + done.stderr
    if any(marker in output for marker in _NETWORK_ERRORS):
        pytest.skip(f"package index unreachable, no megatron-core {version} wheel: {output[-300:]}")
    raise AssertionError(f"pip download megatron-core=={version} failed:\n{output}")


@pytest.fixture(scope="module")
def fixed_release(tmp_path_factory) -> Path:
    """site-packages of a megatron-core 0.20.0 whose function already has #7617's fix."""
    site = tmp_path_factory.mktemp("fixed-release")
    module = site.joinpath(*TILELANG_DSA.split(".")).with_suffix(".py")
    module.parent.mkdir(parents=True)
    for folder in [module.parent, *module.parent.parents]:
        if folder == site:
            break
        (folder / "__init__.py").touch()
    helpers = (
        "\nSparseMLA = None\n\n\n"
        "def _all_bfloat16(*tensors):\n"
        "    return all(t.dtype == torch.bfloat16 for t in tensors)\n\n\n"
        "def _is_supported_sparse_mla_head_count(heads, kv_group=1):\n"
        "    per_group = heads // kv_group\n"
        "    return per_group >= 16 and per_group & (per_group - 1) == 0\n"
    )
    module.write_text(VENDORED.read_text() + helpers)  # upstream merged the PR as written
    info = site / "megatron_core-0.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-core\nVersion: 0.20.0\n")
    return site


@pytest.fixture
def recorded_fixed_in_0_20_0(monkeypatch):
    """The audit's child with #7617 recorded as fixed in 0.20.0 (``fixed_in``), as the
    catalog says once a release ships it: the fixed release's sniff alone would be
    "drifted" (an open pull request has no recorded text, the folder no git history)."""
    recorded = (
        "from backports.megatron import api\n"
        "import dataclasses\n"
        "from packaging.version import Version\n"
        "from backports.megatron import catalog\n"
        "catalog.CATALOG = tuple(\n"
        "    dataclasses.replace(s, fixed_in=Version('0.20.0')) if s.id == 'megatron-lm-7617'\n"
        "    else s for s in catalog.CATALOG\n"
        ")\n"
    )
    child = _candidate._CHILD.replace("from backports.megatron import api\n", recorded, 1)
    assert child != _candidate._CHILD
    monkeypatch.setattr(_candidate, "_CHILD", child)


def _audit(capsys, *argv: str) -> tuple[int, list[dict], str]:
    code = cli.main(["audit", "--json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else [], err


def test_0_18_2_wheel_is_absent(request, capsys):
    wheel = _wheel(request, "0.18.2")
    code, reports, _ = _audit(capsys, "--wheel", str(wheel), "--fail-on-landed")
    report = report_for(reports, BACKPORT_ID)
    assert code == 0 and report["id"] == BACKPORT_ID
    assert report["verdict"] == "absent" and "0.18.2 predates 0.19" in report["reason"]
    assert report_for(reports, "megatron-lm-7091")["verdict"] == "absent"  # no such predicate
    # TopKRouter._apply_expert_bias exists since 0.16, with the same bug in 0.18.2.
    router = report_for(reports, "megatron-lm-6114")
    assert router["verdict"] == "needed", router
    assert "lined up against experts" in router["reason"]
    carrier = report_for(reports, "megatron-lm-6793")  # no carrier method in 0.18
    assert carrier["verdict"] == "absent"
    assert (
        "has checkpointed_forward but not DSAttention._get_index_share_carrier, the part of the "
        "fix that arrives in 0.19" in carrier["reason"]
    )


@pytest.mark.parametrize("version", ["0.18.2", "0.17.1"])
def test_older_wheels_need_6507_and_cannot_take_6321(request, capsys, version):
    """Both bugs are in 0.17.1 and 0.18.2. #6507's builder has the signature it is written
    for (from 0.16): needed. #6321's function (the wheel ships megatron/training from 0.17)
    takes three fewer arguments before 0.19: incompatible, never "not needed"."""
    wheel = _wheel(request, version)
    only = ["--only", "megatron-lm-6507", "--only", "megatron-lm-6321"]
    code, reports, _ = _audit(capsys, "--wheel", str(wheel), *only)
    builder = report_for(reports, "megatron-lm-6507")
    assert code == 0 and builder["verdict"] == "needed", builder
    assert "keeps every parameter's high-precision init value" in builder["reason"]
    exit_status = report_for(reports, "megatron-lm-6321")
    assert exit_status["verdict"] == "incompatible", exit_status
    assert (
        "signature is (load_dir, args, rank0, sharded_state_dict, checkpointing_context)"
        in (exit_status["reason"])
    )


def test_a_release_before_the_bug_is_absent_saying_so(request, capsys):
    """#6682's target is in 0.17.1, masked as the fix masks: the bug came with 0.18."""
    wheel = _wheel(request, "0.17.1")
    code, reports, _ = _audit(capsys, "--wheel", str(wheel), "--only", "megatron-lm-6682")
    (report,) = reports
    assert code == 0 and report["verdict"] == "absent", report
    assert "0.17.1 predates 0.18, the first release with the bug" in report["reason"]


def test_0_19_2_wheel_still_needs_it(request, capsys):
    wheel = _wheel(request, "0.19.2")
    code, reports, _ = _audit(capsys, "--wheel", str(wheel), "--fail-on-landed")
    assert code == 0 and [r["verdict"] for r in builtin_rows(reports)] == ["needed"] * len(CATALOG)
    report = report_for(reports, BACKPORT_ID)
    probed = report["evidence"]["distribution"]["package_dir"]
    assert "backports-audit-" in probed  # the extracted wheel, not the installed copy


@pytest.mark.usefixtures("recorded_fixed_in_0_20_0")
def test_a_release_with_the_fix_fails_the_pin_bump(fixed_release, capsys):
    code, reports, err = _audit(capsys, "--dir", str(fixed_release))
    report = report_for(reports, BACKPORT_ID)
    assert code == 0 and report["verdict"] == "upstream"
    assert report["outcome"] == "landed: delete it"  # what the table's column says
    assert "Delete vendor/megatron_lm_7617/" in report["reason"]
    code, _, err = _audit(
        capsys, "--dir", str(fixed_release), "--fail-on-landed", "--only", BACKPORT_ID
    )
    assert code == 1 and f"delete: {BACKPORT_ID}" in err


def test_a_release_only_the_sniff_calls_fixed_is_drifted_not_landed(fixed_release, capsys):
    """No recorded text (an open pull request), no git history, no release recorded as
    carrying it: the sniff alone never says "delete the backport"."""
    code, reports, _ = _audit(
        capsys, "--dir", str(fixed_release), "--fail-on-landed", "--only", BACKPORT_ID
    )
    (report,) = reports
    assert code == 0 and report["verdict"] == "incompatible", report["reason"]
    assert "drifted: the sniff says fixed but" in report["reason"]
    assert report["evidence"]["landed"] == {"text": {}, "git": False, "release": False}


@pytest.mark.usefixtures("recorded_fixed_in_0_20_0")
def test_table_says_what_to_do(fixed_release, capsys):
    assert cli.main(["audit", "--dir", str(fixed_release)]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    (row,) = [line for line in rows if line.split()[0] == BACKPORT_ID]
    assert header.split()[:5] == ["id", "upstream", "candidate", "verdict", "outcome"]
    upstream = "NVIDIA/Megatron-LM#7617"
    assert row.split()[:4] == [BACKPORT_ID, upstream, "0.20.0", "upstream"]
    assert "landed: delete it" in row


def test_audit_leaves_this_process_alone(fixed_release, tilelang_dsa, capsys):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    _audit(capsys, "--dir", str(fixed_release))
    assert tilelang_dsa.fused_sparse_mla_absorbed is original
    assert str(fixed_release) not in sys.path


def test_bad_candidates_are_usage_errors(tmp_path, capsys):
    (tmp_path / "not-a-wheel.whl").write_text("nope")
    assert _audit(capsys, "--wheel", str(tmp_path / "not-a-wheel.whl"))[0] == 2
    assert _audit(capsys, "--dir", str(tmp_path / "missing"))[0] == 2


# ---- candidates that are not megatron-core ----------------------------------------------------

INSTALLED_CORE = importlib.util.find_spec("megatron.core").origin


def _not_a_candidate(name: Path) -> str:
    return (
        f"backports: {name} is not a megatron-core candidate: it holds no megatron/core "
        f"(megatron.core would come from {INSTALLED_CORE})\n"
    )


def _small_wheel(folder: Path) -> Path:
    """A wheel of another project (the shape of packaging-24.2-py3-none-any.whl)."""
    wheel = folder / "smallpkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("smallpkg/__init__.py", "VALUE = 1\n")
        archive.writestr(
            "smallpkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: smallpkg\n"
        )
        archive.writestr(
            "smallpkg-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
        )
        archive.writestr("smallpkg-1.0.dist-info/RECORD", "")
    return wheel


def test_a_wheel_of_another_project_is_not_a_candidate(tmp_path, capsys):
    wheel = _small_wheel(tmp_path)
    code, reports, err = _audit(capsys, "--wheel", str(wheel))
    assert (code, reports, err) == (2, [], _not_a_candidate(wheel))


@pytest.mark.parametrize("content", [[], ["megatron/training/__init__.py"]])
def test_a_folder_without_megatron_core_is_not_a_candidate(tmp_path, capsys, content):
    for name in content:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    code, reports, err = _audit(capsys, "--dir", str(tmp_path))
    assert (code, reports, err) == (2, [], _not_a_candidate(tmp_path))


def test_an_unknown_id_is_the_same_one_line_error_as_status(fixed_release, capsys):
    code, _, err = _audit(capsys, "--dir", str(fixed_release), "--only", "nonexistent")
    assert cli.main(["status", "--only", "nonexistent"]) == code == 2
    assert capsys.readouterr().err == err
    known = ", ".join(spec.id for spec in CATALOG)
    assert err == f"backports: unknown backport 'nonexistent'; known: {known}\n"
