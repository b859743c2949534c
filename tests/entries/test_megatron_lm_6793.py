"""megatron-lm-6793: one DSA index-share carrier per checkpointed forward.

Real megatron-core 0.19.2 objects throughout: the installed ``checkpointed_forward`` and a
real ``DSAttention`` built on CPU. The only stand-ins are the layers of a block (what
``checkpointed_forward`` calls) and the activation checkpoint itself: megatron's
``tensor_parallel.checkpoint`` saves CUDA RNG state, so on CPU the tests hand the function
torch's re-entrant checkpoint (the same forward-without-grad, recompute-in-backward), or a
recorder that replays chunks later, through a private copy of the function's globals.
"""

import dataclasses
import importlib
import sys
import types
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from backports.megatron._vendor.megatron_lm_6793 import index_share

from backports.megatron.model import SniffFailed

RECOMPUTE = "megatron.core.recompute"
DSA = "megatron.core.transformer.experimental_attention_variant.dsa"
BACKPORT_ID = "megatron-lm-6793"
HOLDER = "_dsa_index_share_topk_holder"


@pytest.fixture(scope="module")
def recompute() -> ModuleType:
    return importlib.import_module(RECOMPUTE)


@pytest.fixture(scope="module")
def dsa() -> ModuleType:
    return importlib.import_module(DSA)


def _attention(dsa: ModuleType, carrier_method: Callable[..., Any] | None = None) -> Any:
    """A real DSAttention skip layer (layer 2 of top-k period 4: it reads layer 1's top-k),
    able to run its unfused forward on CPU. ``carrier_method`` is set on this instance only."""
    config = SimpleNamespace(
        dsa_indexer_topk=1,
        dsa_indexer_topk_freq=4,
        dsa_indexer_skip_topk_offset=1,
        kv_channels=2,
        sequence_parallel=False,
        dsa_indexer_loss_coeff=0.0,
        dsa_indexer_use_sparse_loss=False,
        calculate_per_token_loss=False,
        dsa_indexer_scoring_relu=False,
        attention_backend="unfused",
        kv_lora_rank=0,
        qk_pos_emb_head_dim=0,
    )
    attention = dsa.DSAttention(
        config,
        dsa.DSAttentionSubmodules(indexer=object()),
        layer_number=2,
        attn_mask_type=dsa.AttnMaskType.causal,
        attention_type="self",
        softmax_scale=1.0,
        pg_collection=SimpleNamespace(),
    )
    assert attention.skip_topk and attention.source_layer == 1
    if carrier_method is not None:
        attention._get_index_share_carrier = types.MethodType(carrier_method, attention)
    return attention


def _block(layers: list[Any], *, method: str = "block", num: int = 1, **config: Any) -> Any:
    """What checkpointed_forward reads of a TransformerBlock / HybridStack."""
    settings = dict(
        experimental_attention_variant="dsa",
        dsa_indexer_topk_freq=4,
        fp8=False,
        fp4=False,
        distribute_saved_activations=False,
        recompute_method=method,
        recompute_num_layers=num,
    )
    settings.update(config)
    return SimpleNamespace(
        config=SimpleNamespace(**settings),
        layers=layers,
        num_layers_per_pipeline_rank=len(layers),
        pg_collection=SimpleNamespace(tp=None),
    )


class _TorchCheckpoint:
    """``tensor_parallel`` on CPU: torch's re-entrant checkpoint (no CUDA RNG state)."""

    calls = 0

    def checkpoint(self, function: Callable[..., Any], _distribute: bool, *args: Any) -> Any:
        _TorchCheckpoint.calls += 1
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=True)


@pytest.fixture
def cpu_checkpoint(recompute: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """The live module's ``tensor_parallel`` is torch's checkpoint for this test (the real one
    needs a GPU); the vendored code and megatron's function both read it from there."""
    monkeypatch.setattr(recompute, "tensor_parallel", _TorchCheckpoint())


class _CarrierSpy:
    """A layer that records the scope's carrier each time it runs, with the grad mode."""

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.layer_number = 1
        self.seen: list[tuple[bool, Any]] = []

    def __call__(self, hidden_states: torch.Tensor, **_: Any) -> torch.Tensor:
        self.seen.append((torch.is_grad_enabled(), index_share.current_index_share_carrier()))
        return hidden_states * self.scale


def _args(hidden: torch.Tensor, mask: Any = None, packed: Any = None, **kw: Any) -> dict[str, Any]:
    return dict(
        hidden_states=hidden,
        attention_mask=mask,
        context=None,
        context_mask=None,
        rotary_pos_emb=None,
        attention_bias=None,
        packed_seq_params=packed,
        use_inner_quantization_context=False,
        **kw,
    )


# --- the sniff ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def entry() -> ModuleType:
    return importlib.import_module("backports.megatron.catalog.megatron_lm_6793")


def _pair(recompute: ModuleType, dsa: ModuleType, forward: Any, carrier: Any) -> list[Any]:
    """The two resolved targets, as the probe hands them to the sniff, with these objects."""
    from tests.deciding import resolve_target

    spec = importlib.import_module("backports.megatron.catalog.megatron_lm_6793").SPEC
    first, second = (resolve_target(t, BACKPORT_ID) for t in spec.targets)
    return [
        dataclasses.replace(first, original=forward),
        dataclasses.replace(second, original=carrier),
    ]


def test_sniff_says_needed_on_installed_0_19_2(entry, recompute, dsa):
    result = entry._sniff(
        _pair(
            recompute,
            dsa,
            recompute.checkpointed_forward,
            dsa.DSAttention.__dict__["_get_index_share_carrier"],
        )
    )
    assert result.fixed is False
    # With a mask, the recompute gets a detached copy of it: no holder, no top-k (None); the
    # holder stayed on the caller's mask. Without one, B1 (F1's recompute) read F2's top-k.
    assert result.detail["with_mask"] == {"recompute_read": [None, None], "left_on_mask": [HOLDER]}
    assert result.detail["without_mask"] == {
        "recompute_read": [2.0, 2.0],
        "left_on_config": [HOLDER],
    }


def test_sniff_says_fixed_on_vendored_pair(entry, recompute, dsa):
    result = entry._sniff(
        _pair(
            recompute, dsa, index_share.checkpointed_forward, index_share._get_index_share_carrier
        )
    )
    assert result.fixed is True
    assert result.detail["with_mask"] == {"recompute_read": [1.0, 2.0], "left_on_mask": []}
    assert result.detail["without_mask"] == {"recompute_read": [1.0, 2.0], "left_on_config": []}


def test_sniff_raises_when_a_carrier_method_behaves_like_no_version(entry, recompute, dsa):
    """A carrier method that hands out a fresh object each call loses the top-k between
    layers: neither 0.19.2 nor the fix, so the sniff raises (incompatible)."""

    def fresh_each_call(self, packed_seq_params, attention_mask):
        return SimpleNamespace()

    with pytest.raises(SniffFailed, match="neither"):
        entry._sniff(_pair(recompute, dsa, recompute.checkpointed_forward, fresh_each_call))


def test_sniff_leaves_the_live_modules_alone(entry, recompute, dsa):
    tensor_parallel = recompute.tensor_parallel
    method = dsa.DSAttention.__dict__["_get_index_share_carrier"]
    entry._sniff(
        _pair(
            recompute, dsa, index_share.checkpointed_forward, index_share._get_index_share_carrier
        )
    )
    assert recompute.tensor_parallel is tensor_parallel
    assert dsa.DSAttention.__dict__["_get_index_share_carrier"] is method
    assert not hasattr(dsa.DSAttention, HOLDER)


# --- the vendored code ----------------------------------------------------------------------


def test_nested_scopes_restore_the_outer_value():
    outer, inner = index_share.IndexShareCarrier(), index_share.IndexShareCarrier()
    assert index_share.current_index_share_carrier() is None
    with index_share.index_share_carrier_scope(outer):
        assert index_share.current_index_share_carrier() is outer
        with pytest.raises(KeyError), index_share.index_share_carrier_scope(inner):
            assert index_share.current_index_share_carrier() is inner
            raise KeyError("a failing chunk")
        assert index_share.current_index_share_carrier() is outer
    assert index_share.current_index_share_carrier() is None


def test_packed_seq_params_is_still_the_carrier(dsa):
    from megatron.core.packed_seq_params import PackedSeqParams

    attention = _attention(dsa, index_share._get_index_share_carrier)
    packed = PackedSeqParams(qkv_format="thd")
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    scope = index_share.IndexShareCarrier()
    with index_share.index_share_carrier_scope(scope):
        assert attention._get_index_share_carrier(packed, mask) is packed
        holder = attention._get_index_share_topk_holder(packed, mask)
        assert getattr(packed, HOLDER) is holder
        assert attention._get_index_share_carrier(None, mask) is scope
    assert not hasattr(mask, HOLDER) and not hasattr(scope, HOLDER)


def test_outside_a_scope_the_carrier_is_the_mask_then_the_config(dsa):
    attention = _attention(dsa, index_share._get_index_share_carrier)
    mask = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    assert attention._get_index_share_carrier(None, mask) is mask
    assert attention._get_index_share_carrier(None, None) is attention.config


def test_every_chunk_of_one_call_runs_in_its_own_scope_recompute_included(cpu_checkpoint):
    """Block recompute of one of two layers: layer 0 is checkpointed, layer 1 is not. Both
    see one carrier per call, in forward and in layer 0's recompute; two calls, two carriers."""
    first, second = _CarrierSpy(2.0), _CarrierSpy(3.0)
    block = _block([first, second], method="block", num=1)
    forward = index_share.checkpointed_forward
    inputs = [torch.full((2, 1, 1), 1.0, requires_grad=True) for _ in range(2)]
    outputs = [forward(block, **_args(x)) for x in inputs]
    assert index_share.current_index_share_carrier() is None
    for out in reversed(outputs):
        out.sum().backward()
    assert [x.grad.flatten().tolist() for x in inputs] == [[6.0, 6.0], [6.0, 6.0]]
    # first: F1 (no grad), F2 (no grad), recompute 2, recompute 1; second: F1, F2 (grad).
    assert [grad for grad, _ in first.seen] == [False, False, True, True]
    f1, f2, b2, b1 = (carrier for _, carrier in first.seen)
    assert isinstance(f1, index_share.IndexShareCarrier) and f1 is not f2
    assert b1 is f1 and b2 is f2
    assert [carrier for _, carrier in second.seen] == [f1, f2]


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"experimental_attention_variant": None}, id="not-dsa"),
        pytest.param({"dsa_indexer_topk_freq": 1}, id="freq-1"),
        pytest.param({"dsa_indexer_topk_freq": None}, id="freq-unset"),
        pytest.param("packed", id="packed"),
    ],
)
def test_forwards_that_share_nothing_run_without_a_scope(change, cpu_checkpoint):
    from megatron.core.packed_seq_params import PackedSeqParams

    spy = _CarrierSpy()
    settings = {} if change == "packed" else change
    block = _block([spy], method="uniform", num=1, **settings)
    packed = PackedSeqParams(qkv_format="thd") if change == "packed" else None
    x = torch.ones(2, 1, 1, requires_grad=True)
    index_share.checkpointed_forward(block, **_args(x, packed=packed)).sum().backward()
    assert [grad for grad, _ in spy.seen] == [False, True]
    assert [carrier for _, carrier in spy.seen] == [None, None]


@pytest.mark.parametrize("method", ["uniform", "block"])
@pytest.mark.parametrize("dsa_variant", ["dsa", None])
def test_outputs_and_extraction_are_0_19_2s(method, dsa_variant, cpu_checkpoint):
    """Three layers scaling by 2, 3, 5, two per uniform chunk (block: the first two
    checkpointed); layers 0 and 2 extracted (uniform extracts at a chunk's last layer)."""
    layers = [_CarrierSpy(2.0), _CarrierSpy(3.0), _CarrierSpy(5.0)]
    block = _block(layers, method=method, num=2, experimental_attention_variant=dsa_variant)
    x = torch.ones(2, 1, 1, requires_grad=True)
    forward = index_share.checkpointed_forward
    out, extracted = forward(block, **_args(x, extract_layer_indices={0, 2}, layer_offset=0))
    assert out.flatten().tolist() == [30.0, 30.0]
    if method == "uniform":  # chunks [0, 2) and [2, 3): only the second ends on index 2
        assert [e.flatten().tolist() for e in extracted] == [[30.0, 30.0]]
    else:  # per-layer chunks, recorded at their start index: layers 0 and 2
        assert [e.flatten().tolist() for e in extracted] == [[2.0, 2.0], [30.0, 30.0]]
    assert forward(block, **_args(x)).flatten().tolist() == [30.0, 30.0]


# --- through a real DSAttention -------------------------------------------------------------

SQ = 4


class _ComputingLayer:
    """Stands in for layer 1, the one with an indexer: it picks each micro-batch's top-k from
    its input (channel 0 = the key each query row attends to) and leaves it for layer 2 in
    the real DSAttention holder, without grad, as the real indexer does."""

    layer_number = 1

    def __init__(self, attention: Any) -> None:
        self.attention = attention

    def __call__(self, hidden_states: torch.Tensor, attention_mask: Any, **kw: Any) -> Any:
        holder = self.attention._get_index_share_topk_holder(
            kw.get("packed_seq_params"), attention_mask
        )
        with torch.no_grad():
            holder[1] = hidden_states[:, :, 0].t().long().unsqueeze(-1)  # [b, sq, top-k 1]
        return hidden_states * 1.0


class _SkipLayer:
    """Layer 2: the real DSAttention, q = k = v = the hidden states (one head)."""

    layer_number = 2

    def __init__(self, attention: Any, causal: Any) -> None:
        self.attention = attention
        self.causal = causal

    def __call__(self, hidden_states: torch.Tensor, attention_mask: Any, **kw: Any) -> Any:
        qkv = hidden_states.unsqueeze(2)
        return self.attention(
            qkv,
            qkv,
            qkv,
            attention_mask,
            x=hidden_states,
            qr=hidden_states,
            attn_mask_type=self.causal,
            packed_seq_params=kw.get("packed_seq_params"),
        )


def _two_micro_batches(
    dsa: ModuleType, forward: Callable[..., Any], carrier_method: Any, mask: Any
) -> list[list[list[float]]]:
    """F1, F2, B1, B2 through ``forward``; the input gradients of both micro-batches.

    Micro-batch 1 attends every row to key 0, micro-batch 2 each row to itself, so the
    sum of the outputs has input gradient 4 on row 0 (micro-batch 1) and 1 on every row
    (micro-batch 2), on both channels. Each layer is its own checkpointed chunk.
    """
    attention = _attention(dsa, carrier_method)
    block = _block(
        [_ComputingLayer(attention), _SkipLayer(attention, dsa.AttnMaskType.causal)],
        method="block",
        num=2,
    )
    rows = torch.arange(SQ, dtype=torch.float32)
    inputs = [
        torch.stack([torch.zeros(SQ), 10 + rows], -1).unsqueeze(1).requires_grad_(),
        torch.stack([rows, 20 + rows], -1).unsqueeze(1).requires_grad_(),
    ]
    outputs = [forward(block, **_args(x, mask)) for x in inputs]
    for out in outputs:
        out.sum().backward()
    return [x.grad.squeeze(1).tolist() for x in inputs]


OWN_TOP_K = [[[4.0, 4.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[1.0, 1.0]] * SQ]
# 0.19.2 without a mask: B1's layer 2 reads F2's top-k from the config; then B1's layer 1
# recompute writes F1's there, and B2's layer 2 reads that: the micro-batches swap top-k.
SWAPPED = [OWN_TOP_K[1], OWN_TOP_K[0]]


def test_real_dsattention_recompute_on_0_19_2_without_mask_swaps_top_k(
    dsa, recompute, cpu_checkpoint
):
    grads = _two_micro_batches(dsa, recompute.checkpointed_forward, None, None)
    assert grads == SWAPPED


def test_real_dsattention_recompute_on_0_19_2_with_mask_finds_no_top_k(
    dsa, recompute, cpu_checkpoint
):
    """The recompute gets a detached copy of the mask, which carries no holder: layer 2
    finds no top-k from layer 1 (loud, unlike the silent swap without a mask)."""
    mask = torch.zeros(1, 1, SQ, SQ, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="did not run before it"):
        _two_micro_batches(dsa, recompute.checkpointed_forward, None, mask)


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
def test_real_dsattention_recompute_with_vendored_pair_reads_its_own_top_k(
    dsa, cpu_checkpoint, masked
):
    mask = torch.zeros(1, 1, SQ, SQ, dtype=torch.bool) if masked else None
    grads = _two_micro_batches(
        dsa, index_share.checkpointed_forward, index_share._get_index_share_carrier, mask
    )
    assert grads == OWN_TOP_K
    if mask is not None:
        assert not hasattr(mask, HOLDER)


# --- through apply / revert / status --------------------------------------------------------

HOLDERS = (
    RECOMPUTE,
    "megatron.core.transformer.transformer_block",  # from megatron.core.recompute import ...
    "megatron.core.models.hybrid.hybrid_block",  # the same
    "megatron.core.ssm.mamba_block",  # from ...hybrid_block import *
)


@pytest.fixture(scope="module")
def holders() -> list[ModuleType]:
    return [importlib.import_module(name) for name in HOLDERS]


def _bound(holders: list[ModuleType]) -> list[Any]:
    return [vars(module)["checkpointed_forward"] for module in holders]


def test_apply_rebinds_every_holder_and_the_method(holders, dsa):
    from backports.megatron import apply
    from tests.reports import report_for

    original = vars(holders[0])["checkpointed_forward"]
    method = dsa.DSAttention.__dict__["_get_index_share_carrier"]
    assert _bound(holders) == [original] * len(HOLDERS)

    report = report_for(apply(only=BACKPORT_ID), BACKPORT_ID)
    assert (report.verdict, report.action) == ("needed", "installed")
    replacement = vars(holders[0])["checkpointed_forward"]
    assert replacement.__code__ is index_share.checkpointed_forward.__code__
    assert (replacement.__backport__, replacement.__wrapped__) == (BACKPORT_ID, original)
    assert all(bound is replacement for bound in _bound(holders))
    new_method = dsa.DSAttention.__dict__["_get_index_share_carrier"]
    assert new_method.__code__ is index_share._get_index_share_carrier.__code__
    assert (new_method.__backport__, new_method.__wrapped__) == (BACKPORT_ID, method)


def test_a_module_imported_later_sees_the_replacement(holders, tmp_path, monkeypatch):
    from backports.megatron import apply, revert

    original = vars(holders[0])["checkpointed_forward"]
    name = "late_holder_megatron_lm_6793"
    (tmp_path / f"{name}.py").write_text(
        "from megatron.core.recompute import checkpointed_forward\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    apply(only=BACKPORT_ID)
    late = importlib.import_module(name)
    try:
        assert late.checkpointed_forward is vars(holders[0])["checkpointed_forward"]
        assert late.checkpointed_forward.__backport__ == BACKPORT_ID
        revert(only=BACKPORT_ID)
        assert late.checkpointed_forward is original
    finally:
        sys.modules.pop(name, None)


def test_revert_restores_every_holder_and_the_method_together(holders, dsa):
    from backports.megatron import apply, revert
    from tests.reports import report_for

    original = vars(holders[0])["checkpointed_forward"]
    method = dsa.DSAttention.__dict__["_get_index_share_carrier"]
    apply(only=BACKPORT_ID)
    report = report_for(revert(only=BACKPORT_ID), BACKPORT_ID)
    assert report.action == "reverted"
    assert _bound(holders) == [original] * len(HOLDERS)
    assert dsa.DSAttention.__dict__["_get_index_share_carrier"] is method


def test_status_on_0_19_2_reports_one_needed_report(holders):
    from backports.megatron import status
    from tests.reports import report_for

    report = report_for(status(), BACKPORT_ID)  # exactly one report for the two targets
    assert report.verdict == "needed"
    assert "F1's recompute reads F2's top-k" in report.reason
    assert vars(holders[0])["checkpointed_forward"].__module__ == RECOMPUTE  # changed nothing


def test_applied_real_dsattention_through_the_transformer_block_holder(
    holders, dsa, cpu_checkpoint
):
    """What a TransformerBlock calls: ``transformer_block.checkpointed_forward``, with the
    class's own carrier method. Applied: each micro-batch's own top-k; reverted: swapped."""
    from backports.megatron import applied

    block_module = holders[1]
    with applied(only=BACKPORT_ID):
        assert _two_micro_batches(dsa, block_module.checkpointed_forward, None, None) == OWN_TOP_K
    assert _two_micro_batches(dsa, block_module.checkpointed_forward, None, None) == SWAPPED


def test_apply_is_all_or_nothing_when_the_method_cannot_be_installed(holders, dsa, monkeypatch):
    """The function is rebound in every holder first; then installing the method fails.
    Nothing of the backport may be left: every holder and the class keep the originals."""
    from backports.megatron import apply
    from backports.megatron.kinds import function
    from backports.megatron.kinds import install as patcher
    from tests.reports import report_for

    original = vars(holders[0])["checkpointed_forward"]
    method = dsa.DSAttention.__dict__["_get_index_share_carrier"]
    install_part = function.FunctionKind.install
    rebound_first: list[bool] = []

    def fail_on_the_method(
        kind: Any, backport_id: str, target: Any, resolved: Any, *args: Any
    ) -> Any:
        if resolved.is_method:
            rebound_first.append(vars(holders[1])["checkpointed_forward"] is not original)
            raise RuntimeError("class attribute refused")
        return install_part(kind, backport_id, target, resolved, *args)

    monkeypatch.setattr(function.FunctionKind, "install", fail_on_the_method)
    report = report_for(apply(only=BACKPORT_ID), BACKPORT_ID)
    assert rebound_first == [True]  # the failure came after the holders were rebound
    assert (report.verdict, report.action) == ("incompatible", "skipped")
    assert "class attribute refused" in report.reason
    assert _bound(holders) == [original] * len(HOLDERS)
    assert dsa.DSAttention.__dict__["_get_index_share_carrier"] is method
    assert patcher.installed(BACKPORT_ID) is None


# --- audit of the real wheels ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("version", "verdict", "why"),
    [
        # 0.18.2 holds one part of the fix's targets: the reason names the part it lacks.
        ("0.18.2", "absent", "0.18.2 has checkpointed_forward but not DSAttention"),
        ("0.19.2", "needed", "F1's recompute"),
    ],
)
def test_audit_of_the_real_wheel(request, capsys, version, verdict, why):
    import json

    import tests.commands.test_audit as audit_tests
    from backports.megatron import cli

    wheel = audit_tests._wheel(request, version)
    code = cli.main(["audit", "--json", "--wheel", str(wheel), "--only", BACKPORT_ID])
    (report,) = json.loads(capsys.readouterr().out)
    assert code == 0 and (report["id"], report["verdict"]) == (BACKPORT_ID, verdict)
    assert why in report["reason"]
