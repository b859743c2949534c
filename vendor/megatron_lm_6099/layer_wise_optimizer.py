# Vendored for megatron-backports; see UPSTREAM.toml beside this file.
# repo:    https://github.com/NVIDIA/Megatron-LM
# pr:      6099 (merged 2026-07-29 as 6183f9dbec2509fe00c5f0c27cb930e76520edb6)
# path:    megatron/core/optimizer/layer_wise_optimizer.py
# symbols: LayerWiseDistributedOptimizer.__init__, LayerWiseDistributedOptimizer.count_zeros
# origin:  no upstream text: both methods are megatron-core's installed ones, rebuilt at run
#          time by the rules below (see _source_rule.py), whose sha256 pins the installed text.
"""#6099: the layer-wise optimizer counts gradient zeros with its TP and expert-TP groups.

``count_zeros_fp32`` skips a parameter that is a tensor-parallel replica only when it is told
the groups: megatron-core 0.19.2's ``LayerWiseDistributedOptimizer`` (Muon) passes neither,
so with expert biases under EP > 1, TP > 1 and ETP = 1 the zero count (and, in the children,
the gradient norm, hence clipping) counts replicas. The pull request keeps both groups on the
optimizer when it is built (``expt_tp`` of the process-group collection, else ``tp``), hands
them to every child optimizer before the chain is made (the children filter duplicates when
they collect gradients), and passes them to ``count_zeros_fp32``. The constructor half reaches
only optimizers built after it is installed.

Rules, both named ``tp-groups-for-grad-stats``:
- ``__init__``: before ``super().__init__(optimizers)``, the optimizer's ``tp_group`` and
  ``expert_tp_group`` are set from ``pg_collection`` and copied to each child optimizer;
- ``count_zeros``: its ``count_zeros_fp32`` call gets ``tp_group=`` and ``expert_tp_group=``.
The decorator of ``count_zeros`` (``torch.no_grad()``) is left to the installer, as the
catalog entry declares it.
"""

import ast
import importlib
from typing import Any

from ._source_rule import SourceRule, installed_function, rebuild

# The module that defines both targets; the applier rebinds it where the class lives.
__target_module__ = "megatron.core.optimizer.layer_wise_optimizer"
_OWNER = "LayerWiseDistributedOptimizer"

RULE = "tp-groups-for-grad-stats"

# What the constructor does once its children are final, before the chain is built: the two
# groups are the optimizer's, and each child optimizer gets them too.
_KEEP_THE_GROUPS = """
self.tp_group = self.pg_collection.tp
self.expert_tp_group = getattr(self.pg_collection, "expt_tp", self.tp_group)
for child in optimizers:
    child.tp_group = self.tp_group
    child.expert_tp_group = self.expert_tp_group
"""


def _is_chain_built(statement: ast.stmt) -> bool:
    """``super().__init__(optimizers)``, the statement that builds the chain."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "__init__"
        and isinstance(call.func.value, ast.Call)
        and isinstance(call.func.value.func, ast.Name)
        and call.func.value.func.id == "super"
    )


def _keep_the_groups(definition: ast.FunctionDef) -> int:
    at = [index for index, statement in enumerate(definition.body) if _is_chain_built(statement)]
    for index in reversed(at):
        definition.body[index:index] = ast.parse(_KEEP_THE_GROUPS).body
    return len(at)


def _count_with_the_groups(definition: ast.FunctionDef) -> int:
    changed = 0
    for node in ast.walk(definition):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "count_zeros_fp32":
            for name in ("tp_group", "expert_tp_group"):
                value = ast.Attribute(
                    value=ast.Name(id="self", ctx=ast.Load()), attr=name, ctx=ast.Load()
                )
                node.keywords.append(ast.keyword(arg=name, value=value))
            changed += 1
    return changed


# attribute -> (the method's name on the class, its rule). megatron-core 0.19.2's texts.
_RULES: dict[str, tuple[str, SourceRule]] = {
    "layer_wise_optimizer_init": (
        "__init__",
        SourceRule(
            name=RULE,
            symbol=f"{_OWNER}.__init__",
            installed_sha256="2db6bde86350025e6a2caab7184fc9c2abdbcb0648c58acbd2e4e5f15796faa6",
            edit=_keep_the_groups,
            places=1,
        ),
    ),
    "count_zeros": (
        "count_zeros",
        SourceRule(
            name=RULE,
            symbol=f"{_OWNER}.count_zeros",
            installed_sha256="b97165e66c0ed36239ce8d146aa41f2b57f539bcee8357327862c6222e142a25",
            edit=_count_with_the_groups,
            places=1,
        ),
    ),
}

# attribute -> (the installed method it was rebuilt from, the rebuilt method)
_BUILT: dict[str, tuple[Any, Any]] = {}


def __getattr__(name: str) -> Any:
    """The rebuilt method ``name``, made again whenever the installed one changed (a reload
    makes a new class: the constructor's ``super()`` must see that one)."""
    if name not in _RULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    method, rule = _RULES[name]
    module = importlib.import_module(__target_module__)
    original = installed_function(vars(getattr(module, _OWNER))[method], module)
    built = _BUILT.get(name)
    if built is None or built[0] is not original:
        built = (original, rebuild(original, rule))
        _BUILT[name] = built
    return built[1]
