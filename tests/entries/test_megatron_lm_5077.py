"""megatron-lm-5077: fully-reshardable optimizer state keeps every bucket's moments.

The real 0.19.2 method and the vendored one run on a stand-in optimizer (what the method
reads: ``gbuf_ranges``, ``buffers[i].param_index_map`` / ``buckets``, and
``get_parameter_state_dp_zero``). A real ``DistributedOptimizer`` cannot be built on this
CPU-only torch: megatron-core 0.19.2 allocates its gradient buffers with
``device=torch.cuda.current_device()`` (distributed/param_and_grad_buffer.py). Everything
after the method is real: megatron's ShardedTensors, saved and loaded by
``megatron.core.dist_checkpointing`` (torch_dist) in a one-rank gloo world. Expected moments
come from the layout the test builds, never from the code under test.
"""

import logging
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from backports.megatron._vendor.megatron_lm_5077.distrib_optimizer import (
    sharded_param_state_fully_reshardable as vendored,
)

from backports.megatron import Action, Verdict, apply, revert, status
from tests.reports import report_for

ID = "megatron-lm-5077"
NAME = "sharded_param_state_fully_reshardable"


@pytest.fixture(scope="module")
def optimizer_class() -> type:
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    return DistributedOptimizer


@pytest.fixture(scope="module")
def installed(optimizer_class: type) -> Callable[..., Any]:
    return vars(optimizer_class)[NAME]  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def spec() -> Any:
    from backports.megatron.catalog.megatron_lm_5077 import SPEC

    return SPEC


@pytest.fixture
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A one-rank gloo world. dist_checkpointing's writer copies each tensor to CPU with
    non_blocking=True and then calls torch.cuda.synchronize(); with every tensor already on
    CPU there is no device work to wait for, so on this CUDA-less torch it is a no-op."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    # The save broadcasts a one-element failure flag on "the current CUDA device"; over gloo
    # the flag lives on the CPU.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# --- a gradient buffer with padded bucket ends -------------------------------------------

# (name, shape, bucket): three buckets; buckets 0 and 1 end in padding.
PARAMS = (("p0", (2, 2), 0), ("p1", (3,), 1), ("p2", (3,), 1), ("p3", (2, 3), 2))
BUCKET_PADDED_NUMEL = (8, 16, 6)  # bucket 0: 4 used of 8; bucket 1: 6 of 16; bucket 2: 6 of 6


class Layout:
    """Parameters in a padded gradient buffer, and their true optimizer state."""

    def __init__(self, params=PARAMS, padded_numel=BUCKET_PADDED_NUMEL) -> None:
        self.params = {name: torch.zeros(shape) for name, shape, _ in params}
        self.index_map: dict[torch.Tensor, tuple[int, int, int]] = {}
        used = [0] * len(padded_numel)
        bucket_start = [sum(padded_numel[:i]) for i in range(len(padded_numel))]
        for name, _, bucket in params:
            start = bucket_start[bucket] + used[bucket]
            numel = self.params[name].numel()
            self.index_map[self.params[name]] = (start, start + numel, bucket)
            used[bucket] += numel
        self.buckets = [
            SimpleNamespace(grad_data=torch.zeros(padded), numel_unpadded=unpadded)
            for padded, unpadded in zip(padded_numel, used, strict=True)
        ]
        self.numel_unpadded = sum(used)
        # Distinct values per parameter and key, so a shifted or swapped read shows.
        self.truth = {
            name: {
                key: torch.arange(tensor.numel(), dtype=torch.float32).reshape(tensor.shape)
                + 1000 * index
                + 100 * k
                + 1
                for k, key in enumerate(("param", "exp_avg", "exp_avg_sq"))
            }
            for index, (name, tensor) in enumerate(self.params.items())
        }

    def compact(self, key: str) -> torch.Tensor:
        """What get_parameter_state_dp_zero gathers: the parameters back to back, in buffer
        order, with no bucket-end padding."""
        ordered = sorted(self.params, key=lambda n: self.index_map[self.params[n]][0])
        return torch.cat([self.truth[name][key].reshape(-1) for name in ordered])

    def optimizer(self, *, loading: bool = False) -> SimpleNamespace:
        def get_parameter_state_dp_zero(*, use_gloo_comm, empty_data, return_on_all_ranks):
            assert empty_data is loading
            keys = ("param", "exp_avg", "exp_avg_sq")
            world: dict[str, Any] = {
                key: torch.zeros(self.numel_unpadded) if loading else self.compact(key)
                for key in keys
            }
            world["numel_unpadded"] = self.numel_unpadded
            return {0: {torch.float32: world}}

        buffer = SimpleNamespace(
            param_index_map=self.index_map,
            buckets=self.buckets,
            numel_unpadded=self.numel_unpadded,
        )
        return SimpleNamespace(
            gbuf_ranges=[{torch.float32: [{} for _ in self.buckets]}],
            buffers=[buffer],
            get_parameter_state_dp_zero=get_parameter_state_dp_zero,
        )

    def model_state_dict(self) -> dict[str, Any]:
        from megatron.core.dist_checkpointing import ShardedTensor

        return {
            name: ShardedTensor.from_rank_offsets(f"decoder.{name}", tensor)
            for name, tensor in self.params.items()
        }


def state_by_name(layout: Layout, state: dict[int, dict[str, Any]]) -> dict[str, dict]:
    """{param name: {state key: tensor}} from the method's {index: {key: ShardedTensor}}."""
    names = sorted(layout.params, key=lambda n: layout.index_map[layout.params[n]][0])
    return {names[i]: {k: sh.data for k, sh in tensors.items()} for i, tensors in state.items()}


# --- the sniff ---------------------------------------------------------------------------


def test_sniff_says_needed_on_installed_0_19_2(spec, installed):
    result = spec.sniff([SimpleNamespace(original=installed)])
    assert result.fixed is False
    assert result.detail["two_buckets"]["p1"]["exp_avg"] == [0.0, 0.0, 0.0, 0.0]
    assert result.detail["two_buckets"]["p0"]["exp_avg"] == [0.0, 1.0, 2.0, 3.0]
    assert "read at its padded offset" in result.summary


def test_sniff_says_fixed_on_vendored_code(spec):
    result = spec.sniff([SimpleNamespace(original=vendored)])
    assert result.fixed is True
    assert result.detail["two_buckets"]["p1"]["exp_avg"] == [4.0, 5.0, 6.0, 7.0]


def test_sniff_logs_nothing_on_0_19_2(spec, installed, caplog):
    """0.19.2 warns "padded with zeros" on the sniff's stand-in: that must not reach users."""
    with caplog.at_level(logging.WARNING):
        spec.sniff([SimpleNamespace(original=installed)])
    assert "padded with zeros" not in caplog.text


def _shifted_by_one_bucket(self, model_sharded_state_dict, is_loading=False, metadata=None):
    """Reads every parameter at its compact offset plus 1: like no version."""
    out = vendored(self, model_sharded_state_dict, is_loading, metadata)
    for tensors in out.values():
        for sh in tensors.values():
            sh.data = sh.data + 1
    return out


def test_sniff_raises_on_a_method_unlike_any_version(spec):
    with pytest.raises(RuntimeError, match="one unpadded bucket gave"):
        spec.sniff([SimpleNamespace(original=_shifted_by_one_bucket)])


def test_spec_parameters_match_installed_and_vendored(spec, installed):
    import inspect

    expected = list(spec.target.parameters)
    assert list(inspect.signature(installed).parameters) == expected
    assert list(inspect.signature(vendored).parameters) == expected


# --- the method on a three-bucket layout ---------------------------------------------------


def test_vendored_reads_every_parameter_at_its_compact_offset():
    layout = Layout()
    state = vendored(layout.optimizer(), layout.model_state_dict(), metadata={})
    got = state_by_name(layout, state)
    for name, keys in layout.truth.items():
        for key, tensor in keys.items():
            assert torch.equal(got[name][key], tensor), (name, key)
    sharded = state[3]["exp_avg"]
    assert sharded.key == "optimizer.state.exp_avg.decoder.p3"
    assert sharded.global_shape == (2, 3)


def test_installed_0_19_2_loses_the_state_after_a_padded_bucket(installed, caplog):
    layout = Layout()
    with caplog.at_level(logging.WARNING):
        state = installed(layout.optimizer(), layout.model_state_dict(), metadata={})
    got = state_by_name(layout, state)
    assert torch.equal(got["p0"]["exp_avg"], layout.truth["p0"]["exp_avg"])
    assert not torch.equal(got["p1"]["exp_avg"], layout.truth["p1"]["exp_avg"])
    assert not torch.any(got["p3"]["exp_avg"])  # past the compact end: zeros
    assert "padded with zeros" in caplog.text


def test_vendored_asserts_where_0_19_2_zero_pads(installed):
    """A world tensor shorter than the layout: an error, never silent zeros."""
    layout = Layout()
    optimizer = layout.optimizer()
    full = optimizer.get_parameter_state_dp_zero

    def short(**kwargs):
        world = full(**kwargs)
        inner = world[0][torch.float32]
        for key in ("param", "exp_avg", "exp_avg_sq"):
            inner[key] = inner[key][:-2]
        return world

    optimizer.get_parameter_state_dp_zero = short
    with pytest.raises(AssertionError, match="runs past the compact world tensor"):
        vendored(optimizer, layout.model_state_dict(), metadata={})
    installed(optimizer, layout.model_state_dict(), metadata={})  # zero-pads, no error


def test_mem_efficient_non_zero_rank_gets_none():
    layout = Layout()
    optimizer = layout.optimizer()
    seen = []

    def nothing_here(**kwargs):
        seen.append(kwargs)
        return None

    optimizer.get_parameter_state_dp_zero = nothing_here
    metadata = {"distrib_optim_fully_reshardable_mem_efficient": True}
    assert vendored(optimizer, layout.model_state_dict(), metadata=metadata) is None
    assert seen == [{"use_gloo_comm": True, "empty_data": False, "return_on_all_ranks": False}]


# --- a real save and load through dist_checkpointing -----------------------------------------


def save_and_load(method: Callable[..., Any], tmp_path) -> dict[str, dict]:
    """Save the optimizer state ``method`` describes, load it back with the same method."""
    from megatron.core import dist_checkpointing

    layout = Layout()
    model = layout.model_state_dict()
    saved = method(layout.optimizer(), model, is_loading=False, metadata={})
    dist_checkpointing.save({"optimizer": saved}, str(tmp_path))
    to_load = method(layout.optimizer(loading=True), model, is_loading=True, metadata={})
    loaded = dist_checkpointing.load({"optimizer": to_load}, str(tmp_path))
    return state_by_name(layout, loaded["optimizer"]), layout


def test_saved_moments_load_back_with_the_backport(world_of_one, tmp_path):
    got, layout = save_and_load(vendored, tmp_path)
    for name, keys in layout.truth.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(got[name][key], keys[key]), (name, key)


def test_saved_moments_are_lost_on_0_19_2(world_of_one, tmp_path, installed, caplog):
    # Quiet for this test only: a level left at ERROR hid the warning another test asserts.
    caplog.set_level(logging.ERROR, logger="megatron.core.optimizer.distrib_optimizer")
    got, layout = save_and_load(installed, tmp_path)
    assert torch.equal(got["p0"]["exp_avg"], layout.truth["p0"]["exp_avg"])
    truth = layout.truth
    lost = [n for n in truth if not torch.equal(got[n]["exp_avg"], truth[n]["exp_avg"])]
    assert lost == ["p1", "p2", "p3"]


def test_applied_class_method_round_trips_through_dist_checkpointing(
    world_of_one, tmp_path, optimizer_class
):
    """After apply(), the class's own method saves and loads every moment."""
    report = report_for(apply(only=ID), ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)

    def through_class(self, *args, **kwargs):
        return optimizer_class.sharded_param_state_fully_reshardable(self, *args, **kwargs)

    got, layout = save_and_load(through_class, tmp_path)
    assert all(
        torch.equal(got[n]["exp_avg_sq"], layout.truth[n]["exp_avg_sq"]) for n in layout.truth
    )


# --- apply / revert / status -----------------------------------------------------------------


def test_apply_marks_the_method_and_revert_restores_the_same_object(optimizer_class, installed):
    report = report_for(apply(only=ID), ID)
    assert (report.verdict, report.action) == (Verdict.NEEDED, Action.INSTALLED)
    assert getattr(optimizer_class, NAME).__backport__ == ID
    report_for(revert(only=ID), ID)
    assert vars(optimizer_class)[NAME] is installed


def test_status_on_0_19_2_says_needed_with_its_reason():
    report = report_for(status(only=ID), ID)
    assert report.verdict == Verdict.NEEDED
    assert "read at its padded offset" in report.reason
    assert report.evidence["target"]["attribute"] == f"DistributedOptimizer.{NAME}"
