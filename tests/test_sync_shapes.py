"""Every shape syncs, and a commit without the fix is refused.

A small upstream repository is built here with gitpython, written the way upstream lays out
``megatron/core/transformer/moe/router.py`` (a ``TopKRouter`` class whose
``_apply_expert_bias`` is decorated with ``jit_fuser``): one commit before the fix (the
padding mask lined up against the expert axis) and the fix commit (dropping token rows).
The text is this project's own, in upstream's shape, not a copy.
"""

from __future__ import annotations

import io
import shutil
import tomllib
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import git
import pytest

from backports.megatron.sync import cli
from backports.megatron.sync.assemble import Piece, render_pieces
from backports.megatron.sync.rewrite import Provenance
from tests.test_sync_upstream import cache_home, commit_files, snapshot  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
ID = "megatron-lm-6114"
ROUTER = "megatron/core/transformer/moe/router.py"

ROUTER_TEXT = '''\
# Router shape as upstream writes it: imports, a base class, the top-k router.
from typing import Optional

import torch

from megatron.core.jit import jit_fuser
from megatron.core.transformer.module import MegatronModule


class Router(MegatronModule):
    """Base router."""

    def __init__(self, config):
        super().__init__(config)
        self.config = config


class TopKRouter(Router):
    """Top-k router with an optional per-expert bias."""

    def __init__(self, config):
        super().__init__(config)
        self.enable_expert_bias = True

    @jit_fuser
    def _apply_expert_bias(
        self, routing_map: torch.Tensor, padding_mask: Optional[torch.Tensor] = None
    ):
        """Count this step's routes per expert (not in evaluation or recompute)."""
        if self.enable_expert_bias and torch.is_grad_enabled():
            with torch.no_grad():
                if padding_mask is not None:
                    routing_map = routing_map & MASK_EXPR
                self.local_tokens_per_expert += routing_map.sum(dim=0)

    def routing(self, logits, padding_mask=None):
        return logits
'''
BEFORE = ROUTER_TEXT.replace("MASK_EXPR", "(~padding_mask)")
FIXED = ROUTER_TEXT.replace("MASK_EXPR", "(~padding_mask).unsqueeze(-1)")


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str, str]:
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    before = commit_files(repo, {ROUTER: BEFORE}, "router: expert bias", None)
    fixed = commit_files(repo, {ROUTER: FIXED}, "fix(moe): padding mask by token", before)
    return tmp_path / "Megatron-LM", before, fixed


@pytest.fixture
def vendor(tmp_path: Path) -> Path:
    copy = tmp_path / "vendor"
    shutil.copytree(ROOT / "vendor", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_commit_without_the_fix_is_refused_and_nothing_is_written(
    upstream: tuple[Path, str, str], vendor: Path
) -> None:
    path, before, _ = upstream
    folder = vendor / "megatron_lm_6114"
    kept = snapshot(folder)
    args = ("--backport", ID, "--sha", before, "--repo", str(path), "--vendor-dir", str(vendor))
    code, _, err = run(*args)
    assert code == 1, err
    assert snapshot(folder) == kept
    line = err.strip().splitlines()[-1]  # after megatron's own import notices, if any
    assert err.count("backports sync:") == 1, err
    assert line.startswith("backports sync: refused: vendor/megatron_lm_6114/ at " + before)
    assert "would not carry the fix; the sniff saw:" in line and "--force" in line


def test_force_writes_it_anyway(upstream: tuple[Path, str, str], vendor: Path) -> None:
    path, before, _ = upstream
    args = ("--backport", ID, "--sha", before, "--repo", str(path), "--vendor-dir", str(vendor))
    code, out, _ = run(*args, "--force")
    assert code == 0
    assert "warning: vendor/megatron_lm_6114/ at " + before in out
    assert "the probe will say incompatible" in out


def test_the_fix_commit_syncs_a_method_and_records_its_decorator(
    upstream: tuple[Path, str, str], vendor: Path
) -> None:
    path, _, fixed = upstream
    args = ("--backport", ID, "--sha", fixed, "--repo", str(path), "--vendor-dir", str(vendor))
    code, out, err = run(*args)
    assert code == 0, err
    assert f"the sniff shows the fix at {fixed}" in out
    assert "recorded the decorators of TopKRouter._apply_expert_bias: @jit_fuser" in out
    folder = vendor / "megatron_lm_6114"
    data = tomllib.loads((folder / "UPSTREAM.toml").read_text())
    assert data["synced_sha"] == fixed and data["origin"] == "synced"
    assert data["decorators"] == {"TopKRouter._apply_expert_bias": ["jit_fuser"]}
    assert data["repo"] == "https://github.com/NVIDIA/Megatron-LM.git"  # never the local path
    assert str(path) not in (folder / "UPSTREAM.toml").read_text()
    text = (folder / "router.py").read_text()
    # The method's own text, at the top level, without the decorator the applier adds.
    assert "\ndef _apply_expert_bias(\n    self, routing_map" in text
    assert "@jit_fuser" not in text and "(~padding_mask).unsqueeze(-1)" in text
    assert run("--check", "--vendor-dir", str(vendor))[0] == 0


SCOPE_MODULE = """\
import contextlib
from contextvars import ContextVar

from megatron.core import tensor_parallel

_CARRIER = ContextVar("carrier", default=None)


@contextlib.contextmanager
def carrier_scope(carrier):
    token = _CARRIER.set(carrier)
    try:
        yield carrier
    finally:
        _CARRIER.reset(token)


def checkpointed_forward(function, *args):
    with carrier_scope(object()):
        return tensor_parallel.checkpoint(function, False, *args)
"""
ATTENTION_MODULE = """\
from megatron.core.transformer.module import MegatronModule


class DSAttention(MegatronModule):
    def _get_index_share_carrier(self, packed_seq_params, attention_mask):
        return packed_seq_params or attention_mask or self.config
"""


def test_several_symbols_from_several_files_with_their_module_state() -> None:
    pieces = [
        Piece("megatron/core/recompute.py", "megatron.core.recompute", "checkpointed_forward"),
        Piece(
            "megatron/core/transformer/dsa.py",
            "megatron.core.transformer.dsa",
            "DSAttention._get_index_share_carrier",
        ),
        Piece("megatron/core/recompute.py", "megatron.core.recompute", "_CARRIER", True),
        Piece("megatron/core/recompute.py", "megatron.core.recompute", "carrier_scope", True),
    ]
    sources = {
        "megatron/core/recompute.py": SCOPE_MODULE,
        "megatron/core/transformer/dsa.py": ATTENTION_MODULE,
    }
    provenance = Provenance(
        "https://github.com/NVIDIA/Megatron-LM.git",
        6793,
        "ab" * 20,
        "megatron/core/recompute.py",
        "checkpointed_forward, DSAttention._get_index_share_carrier",
        "megatron.core.recompute",
    )
    vendored, decorators = render_pieces(sources, pieces, provenance)
    text = vendored.text
    assert decorators == {}
    # The carried state is the vendored module's own; the recompute module's globals are
    # live on it; nothing from the attention file is read on its module.
    assert '_CARRIER = ContextVar("carrier", default=None)' in text
    assert "with carrier_scope(object()):" in text
    assert "_live_target().tensor_parallel.checkpoint" in text
    assert "from contextvars import ContextVar" in text and "import contextlib" in text
    assert vendored.reads == ("tensor_parallel",)
    assert "\ndef _get_index_share_carrier(self, packed_seq_params" in text
    namespace: dict[str, object] = {}
    exec(compile(text, "<vendored>", "exec"), namespace)  # imports and defines cleanly
    assert callable(namespace["checkpointed_forward"])
    assert callable(namespace["_get_index_share_carrier"])


DSA = "megatron/core/transformer/experimental_attention_variant/dsa.py"
DSA_MODULE = """\
from megatron.core.transformer.module import MegatronModule


def _carrier_of(config):
    return config


class DSAttention(MegatronModule):
    def _get_index_share_carrier(self, packed_seq_params, attention_mask):
        if packed_seq_params is not None:
            return packed_seq_params
        return _carrier_of(self.config)
"""


def test_6793_syncs_two_files_and_its_module_state(tmp_path: Path, vendor: Path) -> None:
    """Both targets, each from its own file, and the carried ContextVar and scope. This
    fixture's code is not #6793's fix, so the sniff refuses it; --force shows the shape."""
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files = {"megatron/core/recompute.py": SCOPE_MODULE, DSA: DSA_MODULE}
    sha = commit_files(repo, files, "index share carrier", None)
    folder = vendor / "megatron_lm_6793"
    manifest = folder / "UPSTREAM.toml"
    manifest.write_text(
        manifest.read_text().replace(
            "[symbol_paths]", 'carry = ["_CARRIER", "carrier_scope"]\n\n[symbol_paths]'
        )
    )
    kept = snapshot(folder)
    args = ("--backport", "megatron-lm-6793", "--sha", sha, "--repo", str(tmp_path / "Megatron-LM"))
    code, _, err = run(*args, "--vendor-dir", str(vendor))
    assert code == 1 and "refused" in err and snapshot(folder) == kept
    code, _, err = run(*args, "--vendor-dir", str(vendor), "--force")
    assert code == 0, err
    text = (folder / "index_share.py").read_text()
    assert '_CARRIER = ContextVar("carrier", default=None)' in text
    assert "_live_target().tensor_parallel.checkpoint" in text
    assert f'_live_module("{DSA.removesuffix(".py").replace("/", ".")}")._carrier_of' in text
    assert "\ndef _get_index_share_carrier(self, packed_seq_params" in text
    data = tomllib.loads(manifest.read_text())
    assert data["synced_sha"] == sha and data["carry"] == ["_CARRIER", "carrier_scope"]
    assert run("--check", "--vendor-dir", str(vendor))[0] == 0
