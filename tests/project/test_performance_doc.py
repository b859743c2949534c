"""docs/performance.md is what tools/performance_doc.py writes from benchmarks/results/."""

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import ROOT


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "performance_doc", ROOT / "tools" / "performance_doc.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("performance_doc", module)
    spec.loader.exec_module(module)
    return module


def test_committed_page_is_current() -> None:
    assert _generator().main(["--check"]) == 0, "run: python tools/performance_doc.py"


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = _generator()
    page = tmp_path / "performance.md"
    page.write_text(doc.render().replace("4,", "5,", 1))
    monkeypatch.setattr(doc, "PAGE", page)
    monkeypatch.setattr(doc, "ROOT", tmp_path)
    assert doc.main(["--check"]) == 1


def test_figures_and_provenance_come_from_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new result file regenerates the page: its own numbers, its own commit and card."""
    doc = _generator()
    results = tmp_path / "results"
    results.mkdir()
    run = {"status": "ok", "attention": "fused kernel", "tokens_per_s": 1234.0, "peak_gib": 2.5}
    oom = {"status": "out of memory"}
    (results / "dsa_training.json").write_text(
        json.dumps(
            {
                "environment": {"backport": {"device": "Card Z", "commit": "abc1234"}},
                "rows": [{"shape": "8k", "backport": run, "stock": oom}],
            }
        )
    )
    monkeypatch.setattr(doc, "RESULTS", results)
    text = doc.render()
    assert "| 8k | fused kernel, 1,234 tokens/s, peak 2.5 GiB | out of memory |" in text
    assert "date not recorded; commit abc1234; card Card Z." in text
    # A file not committed yet is said so, not filled in from elsewhere.
    assert text.count("No results committed yet.") == len(doc.SECTIONS) - 1
