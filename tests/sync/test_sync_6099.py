"""#6099 syncs at its fix commit: a constructor and a method of one class.

The catalog entry looks for the constructor as ``layer_wise_optimizer_init`` (a vendored
module's own ``__init__`` would be taken for the module's), so the sync defines the method
under that name; its zero-argument ``super()`` (no ``__class__`` cell once the method is a
module-level function) becomes ``super(<live class>, self)``. And a probe that crashes on
the candidate is said to have crashed, not to have shown code without the fix.

A small upstream repository is built here with gitpython, laid out as upstream lays out
``megatron/core/optimizer/layer_wise_optimizer.py``: a commit before the fix and the fix
commit, plus one whose constructor reads a config field the sniff's stand-in lacks. The
code is this project's own, in upstream's shape (a ``ChainedOptimizer`` subclass), not a
copy of upstream's.
"""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import git
import pytest

from backports.megatron.commands import sync as sync_command
from backports.megatron.sync.render import Piece, Provenance, render
from tests.paths import ROOT
from tests.sync.upstreams import (
    commit_files,
    snapshot,
)

# Clones under a temporary cache, off $HOME; the sniff in-process (tests/sync/conftest.py).
pytestmark = pytest.mark.usefixtures("cache_home", "sniff_in_process")

ID = "megatron-lm-6099"
PATH = "megatron/core/optimizer/layer_wise_optimizer.py"

_HEAD = '''\
# The layer-wise optimizer, in upstream's shape (this project's own text).
import torch

from megatron.core.optimizer.clip_grads import count_zeros_fp32
from megatron.core.optimizer.optimizer import ChainedOptimizer


class LayerWiseDistributedOptimizer(ChainedOptimizer):
    """Shards whole parameters over the data-parallel ranks."""

    def __init__(
        self, optimizers, config, pg_collection=None, init_state_fn_list=None, model_chunks=None
    ):
        self.pg_collection = pg_collection
{groups}        self.shard_params(optimizers, None)
        self.overlap_param_gather = config.overlap_param_gather{extra}
        super().__init__(optimizers)

    def shard_params(self, optimizers, layouts):
        raise RuntimeError("needs process groups")

    @torch.no_grad()
    def count_zeros(self):
        params = [p for opt in self.chained_optimizers for p in opt.get_parameters()]
        return count_zeros_fp32(
            params,
            grad_stats_parallel_group=None,
            use_decoupled_grad=self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,{count}
        )
'''
_GROUPS = """\
        self.tp_group = pg_collection.tp
        self.expert_tp_group = getattr(pg_collection, "expt_tp", None) or self.tp_group
        for child in optimizers:
            child.tp_group = self.tp_group
            child.expert_tp_group = self.expert_tp_group
"""
_COUNT = """
            tp_group=self.tp_group,
            expert_tp_group=self.expert_tp_group,"""

BEFORE = _HEAD.format(groups="", extra="", count="")
FIXED = _HEAD.format(groups=_GROUPS, extra="", count=_COUNT)
# The fix, with a constructor that reads a config field the sniff's stand-in config lacks
# (as a later upstream change might add): the sniff cannot run it.
DRIFTED = _HEAD.format(
    groups=_GROUPS, extra="\n        self.newer = config.newer_option", count=_COUNT
)
# The fix, with count_zeros calling a module that 0.19.2 lacks (as a later upstream change
# might add): the vendored module looks it up on the live target module, which lacks it.
NEEDS_A_NEWER_MODULE = FIXED.replace(
    "import torch\n",
    "import torch\n\nimport megatron.core.optimizer.newer_counts as newer_counts\n",
).replace(
    "        return count_zeros_fp32(",
    "        newer_counts.count(params)\n        return count_zeros_fp32(",
)


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    before = commit_files(repo, {PATH: BEFORE}, "layer-wise optimizer", None)
    fixed = commit_files(repo, {PATH: FIXED}, "Fix gradient counting (#6099)", before)
    drifted = commit_files(repo, {PATH: DRIFTED}, "a newer config option", fixed)
    newer = commit_files(repo, {PATH: NEEDS_A_NEWER_MODULE}, "a newer module", fixed)
    shas = {"before": before, "fixed": fixed, "drifted": drifted, "newer": newer}
    return tmp_path / "Megatron-LM", shas


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    copy = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _sync(repo: Path, sha: str, vendor: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = ["--backport", ID, "--sha", sha, "--repo", str(repo), "--vendor-dir", str(vendor)]
    with redirect_stdout(out), redirect_stderr(err):
        code = sync_command.main(args)
    return code, out.getvalue(), err.getvalue()


def test_the_fix_commit_syncs_under_the_name_the_catalog_looks_for(
    upstream: tuple[Path, dict[str, str]], vendor: Path
) -> None:
    repo, shas = upstream
    code, out, err = _sync(repo, shas["fixed"], vendor)
    assert code == 0, (out, err)
    assert f"{ID}: the sniff shows the fix at {shas['fixed']}" in out
    text = (vendor / "megatron_lm_6099" / "layer_wise_optimizer.py").read_text()
    assert "\ndef layer_wise_optimizer_init(\n" in text and "\ndef __init__(" not in text
    assert "super(_live_target().LayerWiseDistributedOptimizer, self).__init__(" in text
    assert "\ndef count_zeros(self):" in text


def test_the_commit_before_the_fix_is_refused_as_lacking_it(
    upstream: tuple[Path, dict[str, str]], vendor: Path
) -> None:
    repo, shas = upstream
    kept = snapshot(vendor)
    code, _, err = _sync(repo, shas["before"], vendor)
    assert code == 1
    assert "would not carry the fix; the sniff saw:" in err and "never gives" in err
    assert snapshot(vendor) == kept


def test_a_probe_that_crashes_on_the_candidate_says_so(
    upstream: tuple[Path, dict[str, str]], vendor: Path
) -> None:
    repo, shas = upstream
    kept = snapshot(vendor)
    code, _, err = _sync(repo, shas["drifted"], vendor)
    assert code == 1
    assert "the probe crashed: AttributeError:" in err and "newer_option" in err, err
    assert "would not carry the fix" not in err
    assert snapshot(vendor) == kept


def test_a_candidate_that_needs_a_newer_module_is_a_crash_not_a_missing_fix(
    upstream: tuple[Path, dict[str, str]], vendor: Path
) -> None:
    repo, shas = upstream
    kept = snapshot(vendor)
    code, _, err = _sync(repo, shas["newer"], vendor)
    assert code == 1
    assert "the probe crashed: AttributeError:" in err and "'newer_counts'" in err, err
    assert "would not carry the fix" not in err
    assert snapshot(vendor) == kept


def test_a_candidate_that_cannot_be_imported_is_a_crash_not_a_missing_fix(tmp_path: Path) -> None:
    from backports.megatron.sync import verify

    candidate = tmp_path / "layer_wise_optimizer.py"
    candidate.write_text("raise ImportError('needs a newer megatron-core')\n")
    seen = verify.sniff_file(ID, candidate)
    assert "fixed" not in seen, seen
    assert seen["summary"] == (
        "the probe crashed: importing the candidate raised ImportError: needs a newer megatron-core"
    )


# --- the renderer alone --------------------------------------------------------------------


_CLASS = """\
class Base:
    def __init__(self, value):
        self.value = value


class Child(Base):
    def __init__(self, value):
        super().__init__(value * 2)
        self.seen = "child"
"""


def _rendered(defined_as: str) -> str:
    provenance = Provenance(
        "https://x/y.git", 1, "a" * 40, "pkg/mod.py", "Child.__init__", "pkg.mod"
    )
    piece = Piece("pkg/mod.py", "pkg.mod", "Child.__init__", defined_as=defined_as)
    return render({"pkg/mod.py": _CLASS}, [piece], provenance).text


def test_a_method_is_defined_under_its_catalog_name_and_its_super_made_explicit() -> None:
    """The rendered method, put back on the class of a live module, runs as the original:
    ``super()`` reaches the base class through the live module's class."""
    import sys
    import types

    text = _rendered("child_init")
    assert "def child_init(self, value):" in text
    assert "super(_live_target().Child, self).__init__(value * 2)" in text
    target = types.ModuleType("pkg_mod_for_test_sync_6099")
    exec(compile(_CLASS, "<target>", "exec"), target.__dict__)
    vendored = types.ModuleType("vendored_for_test_sync_6099")
    sys.modules[target.__name__] = target
    try:
        exec(compile(text, "<vendored>", "exec"), vendored.__dict__)
        vendored.__dict__["__target_module__"] = target.__name__  # as the applier rebinds it
        target.Child.__init__ = vendored.child_init
        made = target.Child(3)
    finally:
        sys.modules.pop(target.__name__)
    assert (made.value, made.seen) == (6, "child")


def test_a_method_without_a_catalog_name_keeps_its_own() -> None:
    assert "\ndef __init__(self, value):" in _rendered("")
