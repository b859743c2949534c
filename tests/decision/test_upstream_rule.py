"""The one rule for ``upstream`` ("delete the backport"): the sniff says fixed and
independent evidence agrees (the installed text of every carried symbol is the fix's, git
ancestry shows the merge, or the installed release is recorded as carrying it); a sniff
saying fixed with none of these is ``incompatible`` ("drifted"). Judged on the real
megatron-core 0.19.2 targets of #6114 (one target) and #6099 (two), with a sniff that says
fixed: what is under test is the evidence, not the sniff.
"""

import dataclasses
import inspect
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import git
import pytest
from packaging.version import Version

from backports.megatron.catalog import MEGATRON_LM_6099, MEGATRON_LM_6114
from backports.megatron.decision import early as early_module
from backports.megatron.evidence import versions as versions_module
from backports.megatron.evidence.fix_text import symbol_digest
from backports.megatron.model import BackportSpec, SniffResult
from backports.megatron.report import Verdict
from backports.megatron.vendored.manifest import manifest_problems
from tests.deciding import probe
from tests.paths import ROOT

MIRROR = Path("/work/.mirror/NVIDIA+Megatron-LM/repo")


def _says_fixed(spec: BackportSpec) -> BackportSpec:
    return dataclasses.replace(spec, sniff=lambda targets: SniffResult(True, "stand-in: fixed"))


def _installed_text_digest(module_name: str, symbol: str) -> str:
    """The installed file's own text of ``symbol``, parsed from the file (not through the
    function object the run-time check reads): what a fix identical to it records."""
    import importlib

    module = importlib.import_module(module_name)
    digest = symbol_digest(Path(module.__file__).read_text(encoding="utf-8"), symbol)
    assert digest is not None
    return digest


def _record(monkeypatch: pytest.MonkeyPatch, spec: BackportSpec, texts: dict[str, str]) -> None:
    """``UPSTREAM.toml`` of ``spec``'s folder as read by the decision, with ``texts`` as its
    ``fixed_symbols_sha256`` (what a sync at the merge records)."""
    real = early_module.read_upstream

    def read(ref: Any) -> Any:
        data = real(ref)
        return {**data, "fixed_symbols_sha256": texts} if ref == spec.vendored else data

    monkeypatch.setattr(early_module, "read_upstream", read)


ROUTER = "megatron.core.transformer.moe.router"
LAYER_WISE = "megatron.core.optimizer.layer_wise_optimizer"


def test_a_fixed_sniff_on_text_no_fix_has_is_drifted_not_upstream():
    """The committed record (#6114's text at its merge) is not 0.19.2's text: drifted."""
    decision = probe(_says_fixed(MEGATRON_LM_6114))
    assert decision.verdict is Verdict.INCOMPATIBLE, decision.reason
    assert "drifted: the sniff says fixed but the installed text of " in decision.reason
    assert "TopKRouter._apply_expert_bias is not the fix's" in decision.reason
    assert "check by hand" in decision.reason
    assert decision.evidence["landed"] == {
        "text": {"TopKRouter._apply_expert_bias": False},
        "git": False,
        "release": False,
    }


def test_a_fixed_sniff_on_the_fix_text_is_upstream(monkeypatch):
    symbol = "TopKRouter._apply_expert_bias"
    _record(monkeypatch, MEGATRON_LM_6114, {symbol: _installed_text_digest(ROUTER, symbol)})
    decision = probe(_says_fixed(MEGATRON_LM_6114))
    assert decision.verdict is Verdict.UPSTREAM, decision.reason
    assert "the installed text of every carried symbol is the fix's" in decision.reason


def test_a_fixed_sniff_in_a_release_recorded_as_carrying_it_is_upstream():
    spec = dataclasses.replace(_says_fixed(MEGATRON_LM_6114), fixed_in=Version("0.19.2"))
    decision = probe(spec)
    assert decision.verdict is Verdict.UPSTREAM, decision.reason
    assert "0.19.2 is recorded as carrying it (fixed in 0.19.2)" in decision.reason


def test_a_fixed_sniff_without_any_recorded_text_is_drifted(monkeypatch):
    _record(monkeypatch, MEGATRON_LM_6114, {})
    decision = probe(_says_fixed(MEGATRON_LM_6114))
    assert decision.verdict is Verdict.INCOMPATIBLE
    assert "no text of the fix is recorded" in decision.reason


def test_git_ancestry_that_shows_the_merge_is_upstream(monkeypatch, tmp_path):
    """The imported checkout's history holds the commit UPSTREAM.toml names as the merge."""
    repo = git.Repo.init(tmp_path / "Megatron-LM", initial_branch="main")
    core = Path(repo.working_tree_dir) / "megatron" / "core"
    core.mkdir(parents=True)
    for name, text in [("package_info.py", "MAJOR = 0\nMINOR = 19\nPATCH = 2\n"), ("fix.py", "")]:
        (core / name).write_text(text)
        repo.index.add([str(core / name)])
        merge = repo.index.commit(name).hexsha
    real = early_module.read_upstream
    monkeypatch.setattr(
        early_module,
        "read_upstream",
        lambda ref: {**real(ref), "merge_sha": merge, "head_sha": merge},
    )
    monkeypatch.setattr(versions_module, "_package_dir", lambda package: core)
    decision = probe(_says_fixed(MEGATRON_LM_6114))
    assert decision.verdict is Verdict.UPSTREAM, decision.reason
    assert "the git checkout contains megatron-lm-6114's merge" in decision.reason
    repo.git.checkout("HEAD~1")  # before the merge: the same sniff, no evidence
    assert probe(_says_fixed(MEGATRON_LM_6114)).verdict is Verdict.INCOMPATIBLE


def test_every_carried_symbol_votes_not_only_the_sniffed_one(monkeypatch):
    """#6099 carries ``__init__`` and ``count_zeros``: a release whose count_zeros (say, the
    one the sniff looks at) is the fix's but whose constructor is not, is drifted."""
    init, count = (
        "LayerWiseDistributedOptimizer.__init__",
        "LayerWiseDistributedOptimizer.count_zeros",
    )
    committed = early_module.read_upstream(MEGATRON_LM_6099.vendored)["fixed_symbols_sha256"]
    _record(
        monkeypatch,
        MEGATRON_LM_6099,
        {init: committed[init], count: _installed_text_digest(LAYER_WISE, count)},
    )
    decision = probe(_says_fixed(MEGATRON_LM_6099))
    assert decision.verdict is Verdict.INCOMPATIBLE, decision.reason
    assert f"the installed text of {init} is not the fix's" in decision.reason
    assert decision.evidence["landed"]["text"] == {init: False, count: True}
    _record(
        monkeypatch,
        MEGATRON_LM_6099,
        {name: _installed_text_digest(LAYER_WISE, name) for name in (init, count)},
    )
    assert probe(_says_fixed(MEGATRON_LM_6099)).verdict is Verdict.UPSTREAM


def test_a_target_without_a_recorded_text_leaves_the_text_unproven(monkeypatch):
    count = "LayerWiseDistributedOptimizer.count_zeros"
    _record(monkeypatch, MEGATRON_LM_6099, {count: _installed_text_digest(LAYER_WISE, count)})
    decision = probe(_says_fixed(MEGATRON_LM_6099))
    assert decision.verdict is Verdict.INCOMPATIBLE
    assert "no text of the fix is recorded for LayerWiseDistributedOptimizer.__init__" in (
        decision.reason
    )


# ---- the normalised text -----------------------------------------------------------------

_BASE = '''
class Router:
    def route(self, x):
        """Send x on."""
        return x + 1  # one more
'''


@pytest.mark.parametrize(
    ("text", "same"),
    [
        (_BASE.replace('"""Send x on."""', '"""Reworded."""'), True),  # docstring
        (_BASE.replace("  # one more", ""), True),  # comment
        (_BASE.replace("x + 1", "(x+1)"), True),  # formatting
        (_BASE.replace("x + 1", "x + 2"), False),  # the code
        (_BASE.replace("def route(self, x)", "def route(self, y)"), False),  # a parameter
    ],
)
def test_the_digest_ignores_what_does_not_run(text, same):
    assert (symbol_digest(text, "Router.route") == symbol_digest(_BASE, "Router.route")) is same


def test_the_digest_of_a_module_flag_covers_its_guard():
    guarded = (
        "try:\n    import fa4\n    HAVE_FA4 = True\nexcept ImportError:\n    HAVE_FA4 = False\n"
    )
    assert symbol_digest(guarded, "HAVE_FA4") is not None
    assert symbol_digest(guarded, "HAVE_FA4") != symbol_digest(
        guarded.replace("ImportError", "Exception"), "HAVE_FA4"
    )
    assert symbol_digest(guarded, "MISSING") is None


class _Holder:
    def method(self):
        """A docstring
        over lines."""
        return """a string
        whose lines keep their indentation"""


def test_a_method_with_a_multi_line_string_digests_as_its_file_text():
    from backports.megatron.evidence.fix_text import object_digest

    own = Path(__file__).read_text(encoding="utf-8")
    assert object_digest(_Holder.method) == symbol_digest(own, "_Holder.method") is not None


def test_a_function_object_and_its_file_text_agree():
    """The run-time side reads the running function's source, the recorded side a file's
    text by qualified name: one normaliser, the same digest."""
    from megatron.core.transformer.moe.router import TopKRouter

    from backports.megatron.evidence.fix_text import object_digest

    symbol = "TopKRouter._apply_expert_bias"
    assert object_digest(TopKRouter._apply_expert_bias) == _installed_text_digest(ROUTER, symbol)
    assert object_digest(textwrap.dedent) == symbol_digest(inspect.getsource(textwrap), "dedent")


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ({"Class.method": "a" * 64}, True),
        ({"Class.method": "A" * 64}, False),
        ({"not a name": "a" * 64}, False),
        (["a" * 64], False),
    ],
)
def test_the_manifest_field_is_checked(value, ok):
    data = early_module.read_upstream(MEGATRON_LM_6114.vendored)
    problems = manifest_problems({**data, "fixed_symbols_sha256": value})
    assert (problems == []) is ok, problems


@pytest.mark.skipif(not MIRROR.is_dir(), reason="needs the local Megatron-LM mirror")
def test_the_recorded_texts_are_the_merges(tmp_path):
    """tools/record_fixed_symbols.py on the mirror (over a copy of vendor/) changes nothing
    committed."""
    vendor = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", vendor)
    tool = ROOT / "tools" / "record_fixed_symbols.py"
    done = subprocess.run(
        [sys.executable, "-P", str(tool), "--repo", str(MIRROR), "--vendor", str(vendor)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "recorded" not in done.stdout, done.stdout
    recorded = [
        folder
        for folder in (ROOT / "vendor").iterdir()
        if "fixed_symbols_sha256"
        in ((folder / "UPSTREAM.toml").read_text() if (folder / "UPSTREAM.toml").is_file() else "")
    ]
    assert len(recorded) == 9  # #5077 #5976 #6010 #6099 #6114 #6321 #6507 #6624 #6682
    assert done.stdout.count(": up to date") == len(recorded)
