"""The ``upstream-tests`` pytest plugin reports a test file that skips itself at import (a
module-level ``pytest.skip``: no GPU, no Transformer Engine) as a skipped row with its
reason, not as tests that never ran with nothing said."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a child pytest


def test_a_module_level_skip_is_a_skipped_row_with_its_reason(tmp_path: Path) -> None:
    (tmp_path / "test_gpu_only.py").write_text(
        "import pytest\n"
        "pytest.skip('needs Transformer Engine', allow_module_level=True)\n"
        "def test_x():\n    assert True\n"
    )
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "backports.megatron._apply_for_pytest", "test_gpu_only.py::test_x"],
        cwd=tmp_path,
        env={"BACKPORTS_UPSTREAM_TESTS_REPORT": str(report), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    data = json.loads(report.read_text())
    assert data["outcomes"] == {"test_gpu_only.py": "skipped"}, done.stdout
    assert data["skips"] == {"test_gpu_only.py": "needs Transformer Engine"}
