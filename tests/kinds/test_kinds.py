"""Target kinds on real megatron-core 0.19.2 objects: a module attribute that is no function
(a Triton ``Autotuner``), a constructor (instances built before the install are counted), a
static method behind its declared decorator (``custom_bwd`` on an ``autograd.Function``).
Every kind is installed and reverted through the one installer, all or none."""

import dataclasses
import sys
import types
import warnings

import pytest

from backports.megatron import BackportWarning
from backports.megatron.job.announce import announce
from backports.megatron.kinds import TargetMissing, kind_of
from backports.megatron.kinds._base import BaseKind
from backports.megatron.kinds.constructor import Constructor
from backports.megatron.kinds.import_guard import ImportGuard
from backports.megatron.kinds.install import installed, uninstall
from backports.megatron.kinds.module_attribute import ModuleAttribute
from backports.megatron.model import Resolved, Target
from backports.megatron.report import Action, Report, Verdict
from tests.installing import install

ROPE = "megatron.core.fusions.fused_mla_yarn_rope_apply"
KERNEL = ModuleAttribute(
    distribution="megatron-core",
    modules=(ROPE,),
    attribute="rotary_fwd_q_kernel",
    type_name="triton.runtime.autotuner:Autotuner",
)
ID = "test-kinds"


@pytest.fixture(autouse=True)
def _uninstall():
    yield
    uninstall(ID)


@pytest.fixture(scope="module")
def rope() -> types.ModuleType:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return __import__(ROPE, fromlist=["rotary_fwd_q_kernel"])


def test_a_module_attribute_is_replaced_at_every_binding_and_put_back_exactly(rope, monkeypatch):
    kernel = rope.rotary_fwd_q_kernel
    holder = types.ModuleType("holds_the_rope_kernel")
    holder.q_kernel = kernel  # `from ... import rotary_fwd_q_kernel as q_kernel`
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    kind = kind_of(KERNEL)
    resolved = kind.resolve(KERNEL, ID)
    assert resolved.original is kernel and kind.refusal(KERNEL, resolved, []) is None
    replacement = object()  # an object that cannot carry __backport__ (no __dict__)
    installation, fresh = install(ID, [(KERNEL, resolved, replacement)])
    assert fresh and rope.rotary_fwd_q_kernel is replacement and holder.q_kernel is replacement
    assert set(installation.sites) >= {(ROPE, KERNEL.attribute), (holder.__name__, "q_kernel")}
    # The record of what was replaced lives on the session, not on the object.
    assert installed(ID) is installation and list(installation.replaced()) == [
        (kernel, replacement)
    ]
    # Found again while installed: what stood there before is the original.
    again = kind.resolve(KERNEL, ID)
    assert again.original is kernel and again.installed is replacement
    uninstall(ID)
    assert rope.rotary_fwd_q_kernel is kernel and holder.q_kernel is kernel
    assert installed(ID) is None


def test_a_module_attribute_of_another_type_is_refused(rope, monkeypatch):
    kind = kind_of(KERNEL)
    monkeypatch.setattr(rope, "rotary_fwd_q_kernel", lambda: None)  # a function, say
    problem = kind.refusal(KERNEL, kind.resolve(KERNEL, ID), [])
    assert problem is not None and "expected triton.runtime.autotuner:Autotuner" in problem


def test_a_module_attribute_rebound_by_someone_else_is_no_longer_live(rope):
    kernel = rope.rotary_fwd_q_kernel
    install(ID, [(KERNEL, kind_of(KERNEL).resolve(KERNEL, ID), object())])
    rope.rotary_fwd_q_kernel = kernel  # a reload's effect
    assert installed(ID) is None  # never reported as installed where it is not
    uninstall(ID)
    assert rope.rotary_fwd_q_kernel is kernel


def test_a_bad_part_leaves_every_kind_as_it_was(rope, tilelang_dsa):
    """A module attribute and a function in one entry: the second is refused, the first
    (already rebound) is put back."""
    kernel = rope.rotary_fwd_q_kernel
    function = Target(
        distribution="megatron-core",
        modules=(tilelang_dsa.__name__,),
        attribute="_can_use_fused_sparse_indexer_target",
        parameters=("query", "key", "topk_indices"),
    )
    stale = dataclasses.replace(kind_of(function).resolve(function, ID), held=len, original=len)
    with pytest.raises(LookupError, match="not the original"):
        install(
            ID,
            [
                (KERNEL, kind_of(KERNEL).resolve(KERNEL, ID), object()),
                (function, stale, lambda query, key, topk_indices: False),
            ],
        )
    assert rope.rotary_fwd_q_kernel is kernel and installed(ID) is None


# ---- a constructor -------------------------------------------------------------------------

CONFIG = "megatron.core.transformer.transformer_config"
POST_INIT = Constructor(
    distribution="megatron-core",
    modules=(CONFIG,),
    attribute="TransformerConfig.__post_init__",
    parameters=("self",),
)


def _config():  # type: ignore[no-untyped-def]
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=1)


def test_a_constructor_counts_the_objects_built_before_it(tilelang_dsa):
    kind = kind_of(POST_INIT)
    resolved = kind.resolve(POST_INIT, ID)
    before = kind.existing(resolved)
    built = [_config(), _config()]
    assert kind.existing(resolved) == before + len(built)
    del built
    assert kind.existing(resolved) == before
    assert kind.evidence(POST_INIT, resolved)["kind"] == "constructor"


def test_a_constructor_counts_objects_of_subclasses_too(tilelang_dsa):
    """A subclass's object ran the constructor through ``super()``: it counts, and only
    objects (not the subclass itself, nor what refers to the class) do."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    kind = kind_of(POST_INIT)
    resolved = kind.resolve(POST_INIT, ID)
    before = kind.existing(resolved)

    class Derived(TransformerConfig):
        pass

    holder = {"class": Derived, "base": TransformerConfig}
    built = Derived(num_layers=1, hidden_size=8, num_attention_heads=1)
    assert kind.existing(resolved) == before + 1
    del built, holder


def test_a_census_counts_each_class_from_one_pass(tilelang_dsa, monkeypatch):
    """Inside ``census``'s block the objects of every construction-time class are counted
    from the one pass made at its start, and the counts are the per-class pass's."""
    import gc
    import types as _types

    from backports.megatron.kinds import constructor

    kind = kind_of(POST_INIT)
    resolved = kind.resolve(POST_INIT, ID)
    built = [_config(), _config()]
    alone = kind.existing(resolved)
    passes = []
    counting = _types.SimpleNamespace(
        get_referrers=lambda *c: passes.append(c) or gc.get_referrers(*c),
        get_objects=gc.get_objects,
    )
    monkeypatch.setattr(constructor, "gc", counting)
    with constructor.census([POST_INIT, POST_INIT]):
        assert len(passes) == 1
        assert kind.existing(resolved) == alone
        assert kind.existing(resolved) == alone
    assert len(passes) == 1
    assert kind.existing(resolved) == alone and len(passes) == 2  # outside: its own pass
    del built


def test_a_constructor_target_is_an_init_or_a_post_init():
    from packaging.version import Version

    from backports.megatron.model import BackportSpec

    with pytest.raises(ValueError, match=r"Class\.__init__ or Class\.__post_init__"):
        BackportSpec(
            id="acme-1",
            title="t",
            targets=(dataclasses.replace(POST_INIT, attribute="TransformerConfig.clone"),),
            target_since=Version("0.19"),
            fixed_in=None,
            sniff=lambda targets: None,  # type: ignore[arg-type,return-value]
        )


def test_an_install_that_cannot_reach_objects_built_before_it_is_the_jobs_one_warning():
    report = Report(
        ID,
        Verdict.NEEDED,
        Action.INSTALLED,
        "lacks the fix [2 Optimizer built before the install: the fix cannot reach them]",
        {"existing_instances": {"x.Optimizer": 2}},
    )
    with pytest.warns(BackportWarning, match="2 Optimizer built before"):
        announce(report)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        announce(report)  # once per job
    quiet = Report(ID, Verdict.NEEDED, Action.INSTALLED, "lacks the fix", {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        announce(quiet)  # an install alone is logged, not warned


# ---- a static method behind its declared decorator ------------------------------------------

LAYERS = "megatron.core.tensor_parallel.layers"
BACKWARD = Target(
    distribution="megatron-core",
    modules=(LAYERS,),
    attribute="LinearWithGradAccumulationAndAsyncCommunication.backward",
    parameters=("ctx", "grad_output"),
    decorator=f"{LAYERS}:custom_bwd",
)


def _vendored_backward(ctx, grad_output):  # type: ignore[no-untyped-def]
    return ("vendored", grad_output)


def test_a_decorated_static_method_is_replaced_on_its_class_and_put_back(tilelang_dsa):
    from megatron.core.tensor_parallel import layers

    owner = layers.LinearWithGradAccumulationAndAsyncCommunication
    held = vars(owner)["backward"]
    assert isinstance(held, staticmethod)
    kind = kind_of(BACKWARD)
    resolved = kind.resolve(BACKWARD, ID)
    assert resolved.decorated and resolved.foreign is None
    assert kind.refusal(BACKWARD, resolved, []) is None  # the body's signature
    install(ID, [(BACKWARD, resolved, _vendored_backward)])
    live = vars(owner)["backward"]
    assert isinstance(live, staticmethod) and live.__backport__ == ID
    # What the class hands out: the function inside, marked, wrapping what the class held.
    assert owner.backward.__backport__ == ID and owner.backward.__wrapped__ is held
    # Through the live decorator (custom_bwd reads the context's autocast state), then ours.
    ctx = types.SimpleNamespace(_fwd_used_autocast=False, _dtype=None)
    assert owner.backward(ctx, "grad") == ("vendored", "grad")
    # Resolved again while installed (status after apply): ours, over what the class held.
    again = kind.resolve(BACKWARD, ID)
    assert again.installed is live and again.held is held and again.foreign is None
    uninstall(ID)
    assert vars(owner)["backward"] is held


def test_a_static_method_without_its_declared_decorator_is_foreign(tilelang_dsa):
    undeclared = dataclasses.replace(BACKWARD, decorator=None)
    resolved = kind_of(undeclared).resolve(undeclared, ID)
    assert resolved.foreign is not None and "wrapped by another patch" in resolved.foreign


def test_a_constructor_comes_before_the_methods_of_its_class():
    """Its methods route the objects built before it to the original as they install,
    after it: an entry that lists one first is refused."""
    from packaging.version import Version

    from backports.megatron.model import BackportSpec

    method = Target(
        distribution="megatron-core",
        modules=POST_INIT.modules,
        attribute="TransformerConfig.clone",
        parameters=("self",),
    )
    with pytest.raises(ValueError, match=r"must come before TransformerConfig\.clone"):
        BackportSpec(
            id="acme-1",
            title="t",
            targets=(method, POST_INIT),
            target_since=Version("0.19"),
            fixed_in=None,
            sniff=lambda targets: None,  # type: ignore[arg-type,return-value]
        )


# ---- a constant: a value Python shares between unrelated bindings ---------------------------

_LIMITS = {
    "limits.py": "LIMIT = 64\nOTHER_LIMIT = 64\n",
    "user.py": "from const_pkg.limits import LIMIT\n",
    "renamed.py": "from .limits import LIMIT as CAP\n",
    "starred.py": "from const_pkg.limits import *\n",
    "unrelated.py": "LIMIT = 64\nWIDTH = 128\n",
}
LIMIT = ModuleAttribute(
    distribution="megatron-core", modules=("const_pkg.limits",), attribute="LIMIT"
)


@pytest.fixture
def const_pkg(tmp_path, monkeypatch):
    """``const_pkg.limits.LIMIT = 64``, imported by name (plain, renamed, starred) by three
    modules; an unrelated module has its own ``LIMIT = 64`` and a ``WIDTH = 128``."""
    package = tmp_path / "const_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in _LIMITS.items():
        (package / name).write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = {name[:-3]: __import__(f"const_pkg.{name[:-3]}", fromlist=["_"]) for name in _LIMITS}
    yield types.SimpleNamespace(**modules)
    uninstall(ID)
    for name in [n for n in sys.modules if n.partition(".")[0] == "const_pkg"]:
        del sys.modules[name]


def test_a_constant_is_rebound_where_imported_by_name_and_nowhere_else(const_pkg):
    import os

    assert os.O_CREAT is const_pkg.limits.LIMIT  # 64 on Linux: one interned int
    kind = kind_of(LIMIT)
    install(ID, [(LIMIT, kind.resolve(LIMIT, ID), 128)])
    assert const_pkg.limits.LIMIT == 128
    assert const_pkg.user.LIMIT == const_pkg.renamed.CAP == const_pkg.starred.LIMIT == 128
    # Equal values that are no alias: os's own, the defining module's other name, a module
    # with a LIMIT of its own.
    assert os.O_CREAT == const_pkg.limits.OTHER_LIMIT == const_pkg.unrelated.LIMIT == 64
    uninstall(ID)
    assert const_pkg.limits.LIMIT == const_pkg.user.LIMIT == const_pkg.renamed.CAP == 64
    assert const_pkg.starred.LIMIT == 64
    # The revert put 64 back where 128 was ours only: an unrelated 128 stays.
    assert const_pkg.unrelated.WIDTH == 128 and os.O_CREAT == 64


# ---- the base class and the record a sniff gets (issue 43 item 5) ----------------------------


class _Stub(BaseKind[types.SimpleNamespace]):
    """A kind written from the base: only what no default can know."""

    name = "stub"

    def found_in(self, module, target, backport_id):  # type: ignore[no-untyped-def]
        held = vars(module).get(target.attribute)
        return (
            None
            if held is None
            else types.SimpleNamespace(module_name=module.__name__, original=held)
        )

    def fingerprint(self, target, resolved):  # type: ignore[no-untyped-def]
        return None

    def stand_in(self, target, resolved, replacement):  # type: ignore[no-untyped-def]
        return types.SimpleNamespace(module_name=resolved.module_name, original=replacement)

    def install(self, backport_id, target, resolved, replacement, markers, aliases):  # type: ignore[no-untyped-def]
        raise AssertionError("not installed here")

    def uninstall(self, part):  # type: ignore[no-untyped-def]
        raise AssertionError("not installed here")

    def is_live(self, part):  # type: ignore[no-untyped-def]
        return False

    def bound(self, resolved):  # type: ignore[no-untyped-def]
        return resolved.original

    def evidence(self, target, resolved):  # type: ignore[no-untyped-def]
        return {}


def test_a_kind_written_from_the_base_class_gets_the_shared_defaults(monkeypatch):
    """Finding goes through ``found_in`` over the candidate modules, newest first; the rest
    is what most kinds share (judged here, after the import, nothing to count or refuse)."""
    newer, older = types.ModuleType("stub_newer"), types.ModuleType("stub_older")
    older.thing = thing = object()
    monkeypatch.setitem(sys.modules, newer.__name__, newer)
    monkeypatch.setitem(sys.modules, older.__name__, older)
    target = Target("megatron-core", (newer.__name__, older.__name__, "stub_absent"), "thing", ())
    kind = _Stub()
    found = kind.find(target, ID)
    assert found is not None and found.original is thing and found.module_name == "stub_older"
    assert kind.resolve(target, ID) == found
    missing = dataclasses.replace(target, attribute="other")
    assert kind.find(missing, ID) is None
    with pytest.raises(TargetMissing, match=r"stub_newer \(no other\); .*stub_absent \(no such"):
        kind.resolve(missing, ID)
    assert (kind.before_import, kind.sniff_in_child) == (False, False)
    assert kind.stock(target, found) is found and kind.refusal(target, found, ["x"]) is None
    assert kind.existing(found) == 0 and kind.aliases(found) == []
    assert kind.after_install([]) == ("", {})
    with kind.unlike_any_version(target, found) as unlike:
        assert unlike is False
    vendored = types.ModuleType("stub_vendored")
    vendored.thing = replacement = object()
    assert kind.replacement(target, vendored) is replacement


def test_a_kind_must_say_what_no_default_can_know():
    class Unfinished(BaseKind[types.SimpleNamespace]):
        name = "unfinished"

    with pytest.raises(TypeError, match="abstract"):
        Unfinished()  # type: ignore[abstract]


def test_every_builtin_kind_is_built_on_the_base_and_gives_sniffs_a_resolved(rope):
    """The record each kind gives out (what a sniff gets) has ``Resolved``'s members."""
    function = Target(
        "megatron-core", ("megatron.core.utils",), "divide", ("numerator", "denominator")
    )
    guard = ImportGuard("megatron-core", ("megatron.core.stub_guarded",), "guarded")
    for target in (KERNEL, function, guard):
        kind = kind_of(target)
        assert isinstance(kind, BaseKind), kind.name
        resolved = kind.resolve(target, ID)
        assert isinstance(resolved, Resolved) and kind.stock(target, resolved).original is not None


# ---- a method the constructor calls: construction-time, routes nothing ----------------------

MFSDP = "megatron.core.distributed.fsdp.src.megatron_fsdp.megatron_fsdp"
HOOKS = Constructor(
    distribution="megatron-core",
    modules=(MFSDP,),
    attribute="MegatronFSDP._register_fsdp_hooks",
    parameters=("self", "root_module"),
    called_from="__init__",
)
SYNC = Target(
    distribution="megatron-core",
    modules=(MFSDP,),
    attribute="MegatronFSDP.synchronize_gradient_reduce",
    parameters=("self",),
)


def _spec(*targets: Target) -> object:
    from packaging.version import Version

    from backports.megatron.model import BackportSpec

    return BackportSpec(
        id="acme-1",
        title="t",
        targets=targets,
        target_since=Version("0.19"),
        fixed_in=None,
        sniff=lambda targets: None,  # type: ignore[arg-type,return-value]
    )


def test_a_method_the_constructor_calls_is_counted_but_routes_nothing():
    """``MegatronFSDP._register_fsdp_hooks`` (the hooks a model keeps): the objects built
    before the install are counted as a constructor's are, but not recorded, so a method of
    the same entry and class (listed after it) runs the replacement for them too."""
    from backports.megatron.kinds._built_before import built_before

    kind = kind_of(HOOKS)
    resolved = kind.resolve(HOOKS, ID)
    owner = resolved.owner
    before = kind.existing(resolved)
    built = [object.__new__(owner), object.__new__(owner)]
    assert kind.existing(resolved) == before + 2
    sync = kind_of(SYNC).resolve(SYNC, ID)

    def hooks(self, root_module):  # type: ignore[no-untyped-def]
        return "hooks"

    def synchronize(self):  # type: ignore[no-untyped-def]
        return "vendored"

    install(ID, [(HOOKS, resolved, hooks), (SYNC, sync, synchronize)])
    assert built_before(ID, owner) is None
    live = vars(owner)["synchronize_gradient_reduce"]
    assert not hasattr(live, "__backport_old_objects__")
    assert live(built[0]) == "vendored"  # an object built before runs the replacement
    uninstall(ID)
    assert vars(owner)["synchronize_gradient_reduce"] is sync.original


def test_a_method_the_constructor_calls_is_named_with_its_constructor():
    _spec(SYNC, HOOKS)  # records nothing: its place among its class's methods is free
    with pytest.raises(ValueError, match="called from '__new__'"):
        _spec(dataclasses.replace(HOOKS, called_from="__new__"))
    with pytest.raises(ValueError, match=r"a method called from Class\.__init__"):
        _spec(dataclasses.replace(HOOKS, attribute="register_fsdp_hooks"))


def test_the_count_finds_the_objects_of_a_class_and_its_subclasses_either_way():
    """A few classes made in Python: one pass in C over their referrers; many: a pass over
    every object. The same objects either way, found by their type."""
    from backports.megatron.kinds.constructor import _alive

    class Base:
        pass

    few = type("Few", (Base,), {})
    made = [Base(), few(), few()]
    assert {id(o) for o in _alive(Base)} == {id(o) for o in made}
    assert {id(o) for o in _alive(few)} == {id(o) for o in made[1:]}
    many = [type(f"Many{i}", (Base,), {}) for i in range(20)]
    made.append(many[-1]())
    assert {id(o) for o in _alive(Base)} == {id(o) for o in made}
