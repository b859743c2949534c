"""Every shape syncs, and a commit without the fix is refused.

A small upstream repository is built here with gitpython, written the way upstream lays out
``megatron/core/transformer/moe/router.py`` (a ``TopKRouter`` class whose
``_apply_expert_bias`` is decorated with ``jit_fuser``): one commit before the fix (the
padding mask lined up against the expert axis) and the fix commit (dropping token rows).
The text is this project's own, in upstream's shape, not a copy. #6793's two files are
the installed megatron-core 0.19.2's own (``recompute.py``: ``checkpointed_forward``;
``dsa.py``: ``DSAttention._get_index_share_carrier``), read from the installed package,
with the fix's edits applied to them.
"""

from __future__ import annotations

import importlib.util
import io
import shutil
import tomllib
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
        code = sync_command.main(list(args))
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
    vendored = render(sources, pieces, provenance)
    decorators = vendored.decorators
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


# #6793 on megatron-core's own files: the installed 0.19.2 ``recompute.py`` and ``dsa.py``
# (read from the installed package, not restated here), with the fix laid out the way the
# pull request does it: the carrier class, its ContextVar, a getter and the scope as module
# state of recompute.py (its first commit), then ``checkpointed_forward`` running each chunk
# it builds inside one fresh carrier's scope and ``DSAttention._get_index_share_carrier``
# asking for that carrier right after packed_seq_params (its second commit). The edits are
# this project's text (from vendor/megatron_lm_6793/index_share.py's behaviour), not
# upstream's code; each lands in exactly one place of the installed text, or the test says
# which one moved.
RECOMPUTE = "megatron/core/recompute.py"


def installed_text(path: str) -> str:
    """The installed megatron-core's file at ``path`` (a repository path under megatron/)."""
    spec = importlib.util.find_spec(path.removesuffix(".py").replace("/", "."))
    assert spec is not None and spec.origin is not None, path
    return Path(spec.origin).read_text(encoding="utf-8")


def edited(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, f"not once in the installed file: {old!r}"
        text = text.replace(old, new)
    return text


CARRIER_STATE = '''

class IndexShareCarrier:
    """What DSA keeps the top-k it shares between layers on: one per checkpointed forward."""


_INDEX_SHARE_CARRIER: ContextVar[Optional[IndexShareCarrier]] = ContextVar(
    "dsa_index_share_carrier", default=None
)


def get_index_share_carrier() -> Optional[IndexShareCarrier]:
    """The carrier of the innermost scope, or None outside every scope."""
    return _INDEX_SHARE_CARRIER.get()


@contextmanager
def index_share_carrier_scope(carrier: IndexShareCarrier):
    """Expose ``carrier`` while the block runs; the outer value comes back after."""
    token = _INDEX_SHARE_CARRIER.set(carrier)
    try:
        yield carrier
    finally:
        _INDEX_SHARE_CARRIER.reset(token)
'''
NULLCONTEXT = "from contextlib import nullcontext\n"
CONTEXTVAR = "from contextvars import ContextVar\n"
TE_CHECKPOINT = "    te_checkpoint = None\n"
# The fix: one carrier per call of a DSA model that shares top-k without packed sequences,
# and every chunk the call builds runs in its scope (the closure keeps the carrier, so the
# recompute of a checkpointed chunk in backward re-enters the same one).
CHUNKS = "    def custom(start: int, end: int):\n"
CARRIER_SETUP = """    carrier = None
    if (
        packed_seq_params is None
        and getattr(self.config, "experimental_attention_variant", None) == "dsa"
        and (getattr(self.config, "dsa_indexer_topk_freq", None) or 1) > 1
    ):
        carrier = IndexShareCarrier()

"""
CHUNK_RETURN = "        return custom_forward\n"
CHUNK_IN_SCOPE = """        if carrier is None:
            return custom_forward

        def scoped_forward(*args):
            with index_share_carrier_scope(carrier):
                return custom_forward(*args)

        return scoped_forward
"""
PACKED_FIRST = "        if packed_seq_params is not None:\n            return packed_seq_params\n"
CARRIER_LOOKUP = """\
        carrier = get_index_share_carrier()
        if carrier is not None:
            return carrier
"""
PACKED_IMPORT = "from megatron.core.packed_seq_params import PackedSeqParams\n"
CARRIER_IMPORT = "from megatron.core.recompute import get_index_share_carrier\n"


def the_6793_files() -> tuple[dict[str, str], dict[str, str]]:
    """The pull request's two commits on the installed files: the carrier and its scope,
    which no forward enters and DSA does not yet ask for (0.19.2's behaviour); then the fix."""
    recompute = edited(
        installed_text(RECOMPUTE),
        (NULLCONTEXT, "from contextlib import contextmanager, nullcontext\n" + CONTEXTVAR),
        (TE_CHECKPOINT, TE_CHECKPOINT + CARRIER_STATE),
    )
    dsa = installed_text(DSA)
    before = {RECOMPUTE: recompute, DSA: dsa}
    fixed = {
        RECOMPUTE: edited(
            recompute, (CHUNKS, CARRIER_SETUP + CHUNKS), (CHUNK_RETURN, CHUNK_IN_SCOPE)
        ),
        DSA: edited(
            dsa,
            (PACKED_IMPORT, PACKED_IMPORT + CARRIER_IMPORT),
            (PACKED_FIRST, PACKED_FIRST + CARRIER_LOOKUP),
        ),
    }
    return before, fixed


CARRY_6793 = [
    "IndexShareCarrier",
    "_INDEX_SHARE_CARRIER",
    "get_index_share_carrier",
    "index_share_carrier_scope",
]


@pytest.fixture
def upstream_6793(tmp_path: Path) -> tuple[Path, str, str]:
    """The pull request's two commits: the carrier alone (before), then the fix."""
    repo = git.Repo.init(tmp_path / "Megatron-LM")
    files_before, files_fixed = the_6793_files()
    before = commit_files(repo, files_before, "recompute: an index-share carrier", None)
    fixed = commit_files(repo, files_fixed, "fix(dsa): one top-k carrier per forward", before)
    return tmp_path / "Megatron-LM", before, fixed


def _carry_6793(vendor: Path) -> Path:
    """The temp vendor's #6793 manifest, told which module state the fix adds."""
    manifest = vendor / "megatron_lm_6793" / "UPSTREAM.toml"
    carry = "carry = [" + ", ".join(f'"{name}"' for name in CARRY_6793) + "]"
    text = manifest.read_text()
    manifest.write_text(text.replace("[symbol_paths]", f"{carry}\n\n[symbol_paths]"))
    return manifest


def test_6793_a_commit_before_the_fix_is_refused(
    upstream_6793: tuple[Path, str, str], vendor: Path
) -> None:
    path, before, _ = upstream_6793
    _carry_6793(vendor)
    folder = vendor / "megatron_lm_6793"
    kept = snapshot(folder)
    args = ("--backport", "megatron-lm-6793", "--sha", before, "--repo", str(path))
    code, _, err = run(*args, "--vendor-dir", str(vendor))
    assert code == 1, err
    assert snapshot(folder) == kept
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"backports sync: refused: vendor/megatron_lm_6793/ at {before}")
    assert "F1's recompute reads F2's top-k" in line


def test_6793_the_fix_commit_syncs_and_its_folder_is_needed_not_incompatible(
    upstream_6793: tuple[Path, str, str],
    vendor: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Accepted without --force; provenance exact; the written folder passes --check, and
    the probe, given that folder, says needed (0.19.2 lacks the fix, the folder has it)."""
    import dataclasses
    import sys

    from backports.megatron.catalog import by_id
    from backports.megatron.model import VendoredRef
    from tests.deciding import probe

    path, _, fixed = upstream_6793
    manifest = _carry_6793(vendor)
    args = ("--backport", "megatron-lm-6793", "--sha", fixed, "--repo", str(path))
    code, out, err = run(*args, "--vendor-dir", str(vendor))
    assert code == 0, err
    assert f"megatron-lm-6793: the sniff shows the fix at {fixed}" in out, out
    assert "megatron-lm-6793: the catalog declares no local changes" in out
    assert "wrote index_share.py and UPSTREAM.toml in vendor/megatron_lm_6793/" in out
    data = tomllib.loads(manifest.read_text())
    assert (data["origin"], data["synced_sha"], data["head_sha"]) == ("synced", fixed, fixed)
    assert data["repo"] == "https://github.com/NVIDIA/Megatron-LM.git"
    assert str(path) not in manifest.read_text()  # never the local clone's path
    assert data["carry"] == CARRY_6793 and data["symbol_paths"] == {
        "DSAttention._get_index_share_carrier": DSA
    }
    folder = vendor / "megatron_lm_6793"
    text = (folder / "index_share.py").read_text()
    # The module state is the vendored module's own; megatron's globals are live reads.
    assert "\nclass IndexShareCarrier:" in text and "\ndef index_share_carrier_scope(" in text
    assert "with index_share_carrier_scope(carrier):" in text
    assert "\n    carrier = get_index_share_carrier()\n" in text  # the method, dedented
    assert "_live_target().tensor_parallel.checkpoint(" in text
    assert set(data["reads"]) >= {"tensor_parallel", "te_checkpoint", "TransformerLayer"}
    assert run("--check", "--vendor-dir", str(vendor))[0] == 0

    # The probe with this folder as the entry's vendored package (a name of its own).
    package = tmp_path / "synced"
    shutil.copytree(folder, package / "synced_megatron_lm_6793")
    monkeypatch.syspath_prepend(str(package))
    spec = dataclasses.replace(
        by_id("megatron-lm-6793"),
        vendored=VendoredRef("synced_megatron_lm_6793", "index_share", "checkpointed_forward"),
    )
    try:
        for upstream_only in (False, True):
            result = probe(spec, upstream_only=upstream_only)
            assert str(result.verdict) == "needed", result.reason
            assert "F1's recompute reads F2's top-k" in result.reason
            shown = result.evidence["vendored_behaviour"]
            assert all(mode["fixed"] for mode in shown.values()), shown
    finally:
        for name in [n for n in sys.modules if n.startswith("synced_megatron_lm_6793")]:
            del sys.modules[name]
