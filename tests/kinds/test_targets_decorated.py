"""Targets that ``backports new --from-pr`` derives and the resolver now takes: a method its
declared decorator wraps with ``functools.wraps`` (``torch.no_grad()``, megatron's
``custom_bwd``), and an ``autograd.Function``'s staticmethod ``forward``/``backward``.

Real megatron-core 0.19.2 classes; the replacements are written here."""

import inspect

import torch

from backports.megatron.kinds.install import uninstall
from backports.megatron.model import Target
from tests.deciding import resolve_target
from tests.installing import install

LAYERWISE = "megatron.core.optimizer.layer_wise_optimizer"
UTILS = "megatron.core.utils"
LAYERS = "megatron.core.tensor_parallel.layers"


def _target(module: str, attribute: str, parameters: tuple[str, ...], decorator=None) -> Target:  # type: ignore[no-untyped-def]
    return Target("megatron-core", (module,), attribute, parameters, decorator=decorator)


def test_a_method_wrapped_by_its_declared_decorator_resolves_to_its_body() -> None:
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer as L

    declared = _target(
        LAYERWISE, "LayerWiseDistributedOptimizer.count_zeros", ("self",), "torch:no_grad"
    )
    resolved = resolve_target(declared, "t-1")
    assert resolved.decorated and resolved.foreign is None
    assert resolved.original is vars(L)["count_zeros"]
    body = inspect.unwrap(resolved.original)
    assert body is not resolved.original and body is inspect.unwrap(vars(L)["count_zeros"])
    assert tuple(inspect.signature(body).parameters) == ("self",)


def test_without_the_decorator_declared_the_wrapper_is_someone_elses() -> None:
    bare = _target(LAYERWISE, "LayerWiseDistributedOptimizer.count_zeros", ("self",))
    resolved = resolve_target(bare, "t-1")
    assert not resolved.decorated
    assert resolved.foreign is not None and "already wrapped" in resolved.foreign


def test_a_decorator_that_makes_another_wrapper_is_not_taken_for_it() -> None:
    """functools.lru_cache's wrapper is not torch.no_grad's: the code differs."""
    other = _target(
        LAYERWISE, "LayerWiseDistributedOptimizer.count_zeros", ("self",), "functools:lru_cache"
    )
    assert not resolve_target(other, "t-1").decorated


def test_an_autograd_backward_behind_custom_bwd_resolves_to_its_body() -> None:
    from megatron.core.tensor_parallel import layers

    cls = layers.LinearWithGradAccumulationAndAsyncCommunication
    target = _target(
        LAYERS,
        "LinearWithGradAccumulationAndAsyncCommunication.backward",
        ("ctx", "grad_output"),
        f"{LAYERS}:custom_bwd",
    )
    resolved = resolve_target(target, "t-2")
    assert resolved.held is vars(cls)["backward"]  # the staticmethod itself, for revert
    assert isinstance(resolved.held, staticmethod)
    assert resolved.decorated and resolved.foreign is None
    body = inspect.unwrap(resolved.original)
    assert tuple(inspect.signature(body).parameters) == ("ctx", "grad_output")


def _doubling_backward(ctx, grad_output):  # type: ignore[no-untyped-def]
    return grad_output * 2, None


def test_an_installed_backward_is_what_autograd_calls_and_revert_restores_it() -> None:
    """MakeViewlessTensor (real, CPU): its backward replaced by one that doubles the
    gradient; autograd reads it off the class; revert puts the very staticmethod back."""
    from megatron.core.utils import MakeViewlessTensor

    original = vars(MakeViewlessTensor)["backward"]
    target = _target(UTILS, "MakeViewlessTensor.backward", ("ctx", "grad_output"))
    resolved = resolve_target(target, "t-3")
    assert not resolved.decorated and resolved.foreign is None

    def grad() -> torch.Tensor:
        x = torch.ones(3, requires_grad=True)
        MakeViewlessTensor.apply(x, True).sum().backward()
        assert x.grad is not None
        return x.grad

    assert torch.equal(grad(), torch.ones(3))
    installation, _ = install("t-3", [(target, resolved, _doubling_backward)])
    try:
        live = vars(MakeViewlessTensor)["backward"]
        assert isinstance(live, staticmethod) and live.__func__.__backport__ == "t-3"
        assert torch.equal(grad(), torch.full((3,), 2.0))
    finally:
        uninstall("t-3")
    assert vars(MakeViewlessTensor)["backward"] is original
    assert torch.equal(grad(), torch.ones(3))
    del installation
