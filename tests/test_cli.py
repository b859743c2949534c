"""``backports status / apply / revert`` in this process, the hook in a temporary folder.

``audit`` and the console script in fresh interpreters: test_audit.py, test_job_start.py.
"""

import json
import subprocess
import sys

import pytest

from backports.megatron import activation, cli, status
from tests import standins
from tests.conftest import BACKPORT_ID


def _main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_status_json_is_status(tilelang_dsa, capsys, tmp_path):
    code, out, _ = _main(capsys, "status", "--json", "--site-dir", str(tmp_path))
    assert code == 0
    assert json.loads(out) == [report.to_dict() for report in status()]


def test_status_table_says_what_apply_would_do(tilelang_dsa, capsys, tmp_path):
    code, out, _ = _main(capsys, "status", "--site-dir", str(tmp_path))
    header, row, hook = out.splitlines()
    assert header.split()[:5] == ["id", "upstream", "megatron-core", "verdict", "action"]
    upstream = "NVIDIA/Megatron-LM#7617"
    assert row.split()[:5] == [BACKPORT_ID, upstream, "0.19.2", "needed", "would-install"]
    assert "lacks the fix" in row
    assert hook.startswith(f"hook: none in {tmp_path}")
    assert code == 0 and activation.read_hook(tmp_path).exists is False


def test_status_strict_fails_on_incompatible(tilelang_dsa, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    assert _main(capsys, "status", "--site-dir", str(tmp_path))[0] == 0
    assert _main(capsys, "status", "--strict", "--site-dir", str(tmp_path))[0] == 1


def test_apply_installs_writes_the_hook_and_is_idempotent(tilelang_dsa, capsys, tmp_path):
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0
    assert tilelang_dsa.fused_sparse_mla_absorbed.__backport__ == BACKPORT_ID
    assert f"hook: wrote {tmp_path / activation.HOOK_FILE}" in out
    assert "installed" in out.splitlines()[1]
    assert "is not a site-packages folder" in out  # a temp folder: say .pth files won't run
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0 and "already-installed" in out
    assert f"hook: unchanged: {tmp_path / activation.HOOK_FILE}" in out
    code, out, _ = _main(capsys, "status", "--site-dir", str(tmp_path))
    assert "activates the backports in every new interpreter" in out


def test_apply_json_prints_reports_only(tilelang_dsa, capsys, tmp_path):
    code, out, err = _main(capsys, "apply", "--json", "--site-dir", str(tmp_path))
    (report,) = json.loads(out)
    assert code == 0 and report["id"] == BACKPORT_ID and report["action"] == "installed"
    assert "hook: wrote" in err


def test_apply_warns_once_and_still_writes_the_hook(tilelang_dsa, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.fixed_upstream)
    code, out, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))
    assert code == 0 and out.count("warning: megatron-backports:") == 1
    assert "upstream" in out.splitlines()[1] and activation.read_hook(tmp_path).current


def test_apply_strict_fails_on_incompatible_without_a_hook(
    tilelang_dsa, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(tilelang_dsa, "fused_sparse_mla_absorbed", standins.new_signature)
    code, _, err = _main(capsys, "apply", "--strict", "--site-dir", str(tmp_path))
    assert code == 1 and "incompatible" in err and "hook not written" in err
    assert not activation.read_hook(tmp_path).exists
    code, _, _ = _main(capsys, "apply", "--site-dir", str(tmp_path))  # not strict: skip it
    assert code == 0 and activation.read_hook(tmp_path).exists


def test_apply_only_and_strict_reach_the_hook(tilelang_dsa, capsys, tmp_path):
    argv = ("apply", "--only", BACKPORT_ID, "--strict", "--site-dir", str(tmp_path))
    assert _main(capsys, *argv)[0] == 0
    assert activation.read_hook(tmp_path).config == {"strict": True, "only": (BACKPORT_ID,)}


def test_unknown_id_is_a_usage_error(capsys, tmp_path):
    code, _, err = _main(capsys, "apply", "--only", "megatron-lm-1", "--site-dir", str(tmp_path))
    assert code == 2 and "unknown backport 'megatron-lm-1'" in err
    assert not activation.read_hook(tmp_path).exists


def test_unwritable_site_dir_is_an_error(tilelang_dsa, capsys, tmp_path):
    code, _, err = _main(capsys, "apply", "--site-dir", str(tmp_path / "missing"))
    assert code == 2 and "backports:" in err


def test_revert_removes_the_hook_and_reverts_idempotently(tilelang_dsa, capsys, tmp_path):
    original = tilelang_dsa.fused_sparse_mla_absorbed
    _main(capsys, "apply", "--site-dir", str(tmp_path))
    code, out, _ = _main(capsys, "revert", "--site-dir", str(tmp_path))
    assert code == 0 and tilelang_dsa.fused_sparse_mla_absorbed is original
    assert f"hook: removed {tmp_path / activation.HOOK_FILE}" in out and "reverted" in out
    code, out, _ = _main(capsys, "revert", "--site-dir", str(tmp_path))
    assert code == 0 and "hook: none at" in out and "not-installed" in out


def test_cli_ignores_this_interpreters_trigger(tilelang_dsa, capsys, tmp_path):
    exec(next(line for line in activation.hook_text().splitlines() if line.startswith("import")))
    assert activation.triggers()
    _main(capsys, "status", "--site-dir", str(tmp_path))
    assert activation.triggers() == []


@pytest.mark.slow
def test_python_m_backports_megatron_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "backports.megatron", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0
    for command in ("status", "apply", "revert", "audit"):
        assert command in done.stdout
