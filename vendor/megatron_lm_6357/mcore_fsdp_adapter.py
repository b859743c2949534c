# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6357 (merged 2026-08-18 as 342faa43cd4c5bcd3297b59bf3cd96aaa3d1d3a7)
# paths:   megatron/core/distributed/fsdp/mcore_fsdp_adapter.py,
#          megatron/core/distributed/fsdp/src/megatron_fsdp/megatron_fsdp.py
# symbols: FullyShardedDataParallel.__init__ (upstream's FullyShardedDataParallelV1 since
#          #5865), MegatronFSDP.all_gather_and_wait_parameters_ready,
#          MegatronFSDP._register_fsdp_hooks, MegatronFSDP.synchronize_gradient_reduce
# origin:  no upstream text: the installed methods, rebuilt at run time by the rules below
#          (see _source_rule.py), whose sha256 pins the installed text.
"""#6357 on megatron-core 0.19.2: which modules are FSDP units, whether Transformer Engine's
wgrad fusion may overwrite ``main_grad``, and which hooks a wrapped model gets.

- ``FullyShardedDataParallel.__init__`` (rule ``fsdp-units-when-sharding``): megatron-core
  0.19.2 makes TransformerLayer, MoETransformerLayer and MambaLayer FSDP units only under
  ``optim_grads_params`` (ZeRO-3). Under ``optim_grads`` (ZeRO-2) the model then has no unit
  but the root, so every gradient is allocated and reduced at once (out of memory, upstream
  issue #6314). The pull request makes them units under every strategy but ``no_shard``.
  Construction-time: a model wrapped before the install keeps its units.
- ``MegatronFSDP.all_gather_and_wait_parameters_ready`` (rule ``overwrite-only-sharded-grads``):
  0.19.2 marks every gathered parameter ``overwrite_main_grad = True``, so with TE's gradient
  accumulation fusion each micro-batch's weight gradient overwrites ``main_grad`` instead of
  adding to it; right only where the gradient buffer is sharded (``optim_grads``,
  ``optim_grads_params``), wrong under ``optim`` (ZeRO-1). The pull request sets it to
  whether the gradient is sharded. The megatron-fsdp wheel ships the same method (the same
  text): its copy is rebuilt from its own module.

- ``MegatronFSDP._register_fsdp_hooks`` (rule ``hooks-per-sharding-strategy``): the hooks a
  model gets when it is wrapped. In 0.19.2 the post-backward closures (the per-parameter
  one and the root one) reduce the gradients on the last micro-batch whatever
  ``overlap_grad_reduce`` says, so without it ``no_shard`` and ``optim`` reduce them there
  and again in ``start_grad_sync``; and every FSDP unit gets the post-forward hook that
  releases its parameters, which only ZeRO-3 (``optim_grads_params``) shards. The pull
  request reduces in those closures only where the gradient is sharded or the reduction is
  overlapped, registers the post-forward hook only under ZeRO-3 and makes that hook refuse
  any other strategy. Construction-time: a model wrapped before the install keeps its hooks.
- ``MegatronFSDP.synchronize_gradient_reduce`` (rule ``no-sync-reduce-of-sharded-grads``):
  without ``overlap_grad_reduce`` it reduces synchronously under any strategy; the pull
  request refuses ZeRO-2/3 there (their gradients must be reduce-scattered as they are made).

The megatron-fsdp wheel ships the same three MegatronFSDP methods (the same texts): each copy
is rebuilt from its own module.
"""

import ast
import importlib
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild, source_sha256

_UNITS_RULE = "fsdp-units-when-sharding"
_OVERWRITE_RULE = "overwrite-only-sharded-grads"
_ADAPTER = "megatron.core.distributed.fsdp.mcore_fsdp_adapter"
_CORE = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp"
_WHEEL = "megatron_fsdp.megatron_fsdp"


def _is_zero3_test(node: ast.AST) -> bool:
    """``self.ddp_config.data_parallel_sharding_strategy == "optim_grads_params"``."""
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.ops[0], ast.Eq)
        and len(node.comparators) == 1
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value == "optim_grads_params"
        and ast.unparse(node.left) == "self.ddp_config.data_parallel_sharding_strategy"
    )


def _units_when_sharding(definition: ast.FunctionDef) -> int:
    # The default unit modules: chosen for every strategy that shards anything.
    changed = 0
    for node in ast.walk(definition):
        if isinstance(node, ast.If) and _is_zero3_test(node.test):
            node.test = ast.Compare(
                left=node.test.left,  # type: ignore[attr-defined]
                ops=[ast.NotEq()],
                comparators=[ast.Constant("no_shard")],
            )
            changed += 1
    return changed


_SHARDED_GRADS = 'self.data_parallel_sharding_strategy in ("optim_grads", "optim_grads_params")'


def _overwrite_only_sharded_grads(definition: ast.FunctionDef) -> int:
    changed = 0
    for node in ast.walk(definition):
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and ast.unparse(node.targets[0]) == "param.overwrite_main_grad"
            and isinstance(node.value, ast.Constant)
            and node.value.value is True
        ):
            node.value = ast.parse(_SHARDED_GRADS, mode="eval").body
            changed += 1
    return changed


# The condition both post-backward closures test before they reduce: sharded gradients
# (``grad_reduce_every_bprop``), the last micro-batch, or auto-sync.
_REDUCE_TEST = "grad_reduce_every_bprop or is_last_microbatch or self.model_auto_sync"
_ZERO3 = 'self.ddp_config.data_parallel_sharding_strategy == "optim_grads_params"'
_RESHARD_ONLY_ZERO3 = (
    'self.data_parallel_sharding_strategy == "optim_grads_params", '
    '"the post-forward hook releases parameters only ZeRO-3 (optim_grads_params) shards"'
)


def _expression(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


def _reduce_only_sharded_or_overlapped(node: ast.If) -> bool:
    """``sharded or last or auto`` becomes ``sharded or (overlap_grad_reduce and (last or
    auto))``: an unsharded gradient is reduced once, by start_grad_sync, unless overlapped."""
    if ast.unparse(node.test) != _REDUCE_TEST:
        return False
    assert isinstance(node.test, ast.BoolOp)
    sharded, *when = node.test.values
    overlapped = ast.BoolOp(
        op=ast.And(),
        values=[_expression("self.ddp_config.overlap_grad_reduce"), ast.BoolOp(ast.Or(), when)],
    )
    node.test = ast.BoolOp(op=ast.Or(), values=[sharded, overlapped])
    return True


def _is_reshard_registration(node: ast.stmt) -> bool:
    """``... = module.register_forward_hook(_post_forward, ...)``."""
    call = node.value if isinstance(node, ast.Assign) else None
    return (
        isinstance(call, ast.Call)
        and ast.unparse(call.func) == "module.register_forward_hook"
        and bool(call.args)
        and isinstance(call.args[0], ast.Name)
        and call.args[0].id == "_post_forward"
    )


def _hooks_per_sharding_strategy(definition: ast.FunctionDef) -> int:
    changed = 0
    for node in ast.walk(definition):
        if isinstance(node, ast.If) and _reduce_only_sharded_or_overlapped(node):
            changed += 1
        if isinstance(node, ast.FunctionDef) and node.name == "_post_forward":
            # The hook (also handed out as post_forward_release_module) refuses ZeRO-1/2.
            node.body.insert(0, ast.parse(f"assert {_RESHARD_ONLY_ZERO3}").body[0])
            changed += 1
        for field in ("body", "orelse"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for index, statement in enumerate(block):
                if isinstance(statement, ast.stmt) and _is_reshard_registration(statement):
                    # Registered only where the parameters are sharded.
                    block[index] = ast.If(test=_expression(_ZERO3), body=[statement], orelse=[])
                    changed += 1
    return changed


_SHARDED_GRADS_REFUSED = (
    'self.data_parallel_sharding_strategy not in ("optim_grads", "optim_grads_params"), '
    '"optim_grads and optim_grads_params reduce-scatter gradients as they are made: they '
    'need overlap_grad_reduce=True, not a synchronous reduction"'
)


def _no_sync_reduce_of_sharded_grads(definition: ast.FunctionDef) -> int:
    # The branch taken without overlap_grad_reduce refuses sharded gradients first.
    changed = 0
    for node in ast.walk(definition):
        if (
            isinstance(node, ast.If)
            and ast.unparse(node.test) == "self.ddp_config.overlap_grad_reduce"
            and node.orelse
        ):
            node.orelse.insert(0, ast.parse(f"assert {_SHARDED_GRADS_REFUSED}").body[0])
            changed += 1
    return changed


# One rule per installed text: megatron-core 0.19.2's first (its message names the text a
# refused one was compared with), then 0.18.2's and 0.17.1's (the units were TransformerLayer
# alone; the same test on the strategy).
_UNITS = tuple(
    SourceRule(
        name=_UNITS_RULE,
        symbol="FullyShardedDataParallel.__init__",
        installed_sha256=sha256,
        edit=_units_when_sharding,
        places=1,
    )
    for sha256 in (
        "144bc72268ce1f3ce1d6ee350f7726dbf0117d8ccda3ef4f557074a3f741f903",
        "99fdbcfeec40074d447e0882972e41c483855293f5edd900fbb9b8da7b66d595",
        "d5661b3407c527a3e780a552cf7918541c049b25045b2144abb99605c8797fcb",
    )
)
# megatron-core 0.17.1 to 0.19.2 and megatron-fsdp 0.6.1 hold this very text.
_OVERWRITE = (
    SourceRule(
        name=_OVERWRITE_RULE,
        symbol="MegatronFSDP.all_gather_and_wait_parameters_ready",
        installed_sha256="767ad3323d31125b4001b5a1f87d230f589d8f09de467587e8a8b440b3a81d0a",
        edit=_overwrite_only_sharded_grads,
        places=1,
    ),
)

# megatron-core 0.19.2 (and megatron-fsdp 0.6.1) first, then 0.18.2 (megatron-fsdp 0.5.0)
# and 0.17.1 (megatron-fsdp 0.4.0): the same four places in each.
_HOOKS = tuple(
    SourceRule(
        name="hooks-per-sharding-strategy",
        symbol="MegatronFSDP._register_fsdp_hooks",
        installed_sha256=sha256,
        edit=_hooks_per_sharding_strategy,
        places=4,
    )
    for sha256 in (
        "dffa2fde1ecfdd729e35e6bc4300a117cbecdead72b510e936e4d82887b8ec6f",
        "eb4e43ea7e7b5c40adba6aa8b3d3c1b82231bfc4cd0e31d60e5f305de713a40d",
        "e136509d28d2139a9d1a3f6b365c8148ebdb41cac3a8d4eabe7de296d99e747b",
    )
)
# megatron-core 0.15.3 to 0.19.2 and megatron-fsdp 0.1.0 to 0.6.1 hold this very text.
_SYNC = (
    SourceRule(
        name="no-sync-reduce-of-sharded-grads",
        symbol="MegatronFSDP.synchronize_gradient_reduce",
        installed_sha256="32499395f3a2009096eaf61762dc94ae6a3ca5cc5cfc7b336ff69168760b9208",
        edit=_no_sync_reduce_of_sharded_grads,
        places=1,
    ),
)

# replacement name -> (module, class, method, the rules for each installed text)
_RULES: dict[str, tuple[str, str, str, tuple[SourceRule, ...]]] = {
    "fully_sharded_data_parallel_init": (_ADAPTER, "FullyShardedDataParallel", "__init__", _UNITS),
    "all_gather_and_wait_parameters_ready": (
        _CORE,
        "MegatronFSDP",
        "all_gather_and_wait_parameters_ready",
        _OVERWRITE,
    ),
    "megatron_fsdp_all_gather_and_wait_parameters_ready": (
        _WHEEL,
        "MegatronFSDP",
        "all_gather_and_wait_parameters_ready",
        _OVERWRITE,
    ),
    "_register_fsdp_hooks": (_CORE, "MegatronFSDP", "_register_fsdp_hooks", _HOOKS),
    "megatron_fsdp_register_fsdp_hooks": (_WHEEL, "MegatronFSDP", "_register_fsdp_hooks", _HOOKS),
    "synchronize_gradient_reduce": (_CORE, "MegatronFSDP", "synchronize_gradient_reduce", _SYNC),
    "megatron_fsdp_synchronize_gradient_reduce": (
        _WHEEL,
        "MegatronFSDP",
        "synchronize_gradient_reduce",
        _SYNC,
    ),
}

# Upstream's main (#5865) calls the adapter's class FullyShardedDataParallelV1 (there
# FullyShardedDataParallel is a function that picks V1 or V2).
_RENAMED = {"FullyShardedDataParallel": "FullyShardedDataParallelV1"}


def _owner(module: Any, name: str, method: str) -> Any:
    """The class ``name`` of ``module`` that defines ``method``, else its renamed one."""
    for candidate in (name, _RENAMED.get(name, name)):
        owner = getattr(module, candidate, None)
        if isinstance(owner, type) and method in vars(owner):
            return owner
    raise AttributeError(f"{module.__name__} has no class {name} that defines {method}")


# replacement name -> (the installed method it was rebuilt from, the rebuilt method)
_BUILT: dict[str, tuple[Any, Any]] = {}


def __getattr__(name: str) -> Any:
    """The rebuilt method ``name``, made again whenever the installed one changed (a reload
    makes a new class: the constructor's ``super()`` must see that one)."""
    if name not in _RULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, owner, method, rules = _RULES[name]
    module = importlib.import_module(module_name)
    original = installed_function(vars(_owner(module, owner, method))[method], module)
    built = _BUILT.get(name)
    if built is None or built[0] is not original:
        text = source_sha256(original)
        rule = next((r for r in rules if r.installed_sha256 == text), rules[0])
        built = (original, rebuild(original, rule))
        _BUILT[name] = built
    return built[1]
