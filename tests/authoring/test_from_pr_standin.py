"""The recording stand-ins a derived sniff runs on (``standin``), the search for an input
that tells two versions apart (``explore``), and the judgement of what a call did.

The functions observed here are small ones written for the test: the mechanism is what is
under test; the real megatron targets are observed in tests/authoring/test_from_pr_command.py."""

import sys
import textwrap
from pathlib import Path

import pytest
import torch

from backports.megatron.authoring.from_pr import explore, standin
from backports.megatron.authoring.from_pr.standin import Mismatch, Observation, Setting, StandIn
from backports.megatron.private_globals import with_globals

# The name a pull request's test would import at module level; bound here only through the
# test's private globals. (Importing megatron.core while this file is collected runs
# setuptools, which drops ``backports`` from sys.modules under the next test files' feet.)
GeLUFunction = None


def _run(function, setting: Setting | None = None, recorders=(), module="m"):  # type: ignore[no-untyped-def]
    return standin.observe(function, setting or Setting(), recorders, module, with_globals)


def test_an_attribute_is_there_only_once_a_call_needed_it() -> None:
    def reads(self):
        optional = getattr(self, "optional", "absent")
        return self.config.size, hasattr(self, "other"), optional

    setting = Setting()
    run = _run(reads, setting)
    assert setting.attributes == {"self.config", "self.config.size"}  # learned, in turn
    assert run.outcome == "return (<self.config.size>, False, 'absent')"


def test_a_missing_attribute_raises_attribute_error_naming_the_stand_in() -> None:
    run = standin.Run(Setting())
    with pytest.raises(AttributeError) as caught:
        _ = StandIn("ctx", run).saved
    assert caught.value.name == "saved" and isinstance(caught.value.obj, StandIn)


def test_unpacking_learns_how_many_items_a_stand_in_holds() -> None:
    def unpacks(ctx):
        _, second, _ = ctx.saved_tensors
        return second

    setting = Setting()
    run = _run(unpacks, setting)
    assert setting.lengths == {"ctx.saved_tensors": 3}
    assert run.outcome == "return <ctx.saved_tensors[1]>"


def test_calls_and_writes_are_facts_reads_and_questions_are_not() -> None:
    def acts(self, x):
        if self.ready:  # a question: not a fact
            self.never()
        self.sink(x, 2, mode="a", scale=torch.ones(2, dtype=torch.float32))
        self.sink(x)
        self.count = 3
        x["k"] = None
        return self.sink

    facts = set(_run(acts).facts)
    assert facts == {
        "call self.sink#0",
        "call self.sink#0 arg0=<x>",
        "call self.sink#0 arg1=2",
        "call self.sink#0 mode='a'",
        "call self.sink#0 scale=tensor[torch.float32, (2,)]",
        "call self.sink#1",
        "call self.sink#1 arg0=<x>",
        "set self.count=3",
        "setitem x['k']=None",
        "return <self.sink>",
    }


def test_a_truth_setting_takes_the_other_branch() -> None:
    def branches(self):
        return "yes" if self.flag > 1 else "no"

    assert _run(branches).outcome == "return 'no'"
    assert _run(branches, Setting(truths={"(self.flag > 1)": True})).outcome == "return 'yes'"


def test_an_argument_may_be_none_or_its_default() -> None:
    def takes(a, b=7):
        return a, b

    assert _run(takes, Setting(arguments={"a": "none"})).outcome == "return (None, 7)"
    assert _run(takes, Setting(arguments={"b": "stand-in"})).outcome == "return (<a>, <b>)"


def _versions():  # type: ignore[no-untyped-def]
    def installed(self, batch):
        if not self.enabled:
            return None
        return self.model(batch, labels=batch.labels)

    def fixed(self, batch):
        if not self.enabled:
            return None
        return self.model(batch, labels=batch.labels, mask=batch.mask)

    return installed, fixed


def test_the_search_finds_the_input_that_tells_the_versions_apart() -> None:
    installed, fixed = _versions()
    found = explore.search(
        installed, fixed, target="M.forward", module="m", recorders=(), with_globals=with_globals
    )
    assert found is not None and found.clean
    o = found.observation
    assert o.main["truths"] == {"self.enabled": True}
    assert o.fixed == ("call self.model#0 mask=<batch.mask>",)
    assert o.needed == ()
    assert o.anchors == ("call self.model#0",)
    # No input on which both do something agreed (disabled: both only return None): the
    # control is what both did on the main input.
    assert o.control["truths"] == o.main["truths"]
    assert o.control_facts == (
        "call self.model#0",
        "call self.model#0 arg0=<batch>",
        "call self.model#0 labels=<batch.labels>",
        "return <self.model#0()>",
    )


def test_a_focus_keeps_only_differences_the_test_observes() -> None:
    installed, fixed = _versions()
    common = {"target": "M.forward", "module": "m", "recorders": (), "with_globals": with_globals}
    assert explore.search(installed, fixed, focus=frozenset({"loss"}), **common) is None
    found = explore.search(installed, fixed, focus=frozenset({"mask"}), **common)
    assert found is not None and found.observation.fixed == ("call self.model#0 mask=<batch.mask>",)


def test_a_fixed_version_that_raises_where_the_installed_returns_is_no_sniff() -> None:
    def installed(self):
        return self.value

    def fixed(self):
        raise RuntimeError("broken vendoring")

    found = explore.search(
        installed, fixed, target="f", module="m", recorders=(), with_globals=with_globals
    )
    assert found is None


def _observation(**changes):  # type: ignore[no-untyped-def]
    installed, fixed = _versions()
    found = explore.search(
        installed, fixed, target="M.forward", module="m", recorders=(), with_globals=with_globals
    )
    assert found is not None
    return found.observation, installed, fixed


def test_judge_says_fixed_needed_or_neither() -> None:
    o, installed, fixed = _observation()
    assert standin.judge(standin.seen(fixed, o, with_globals), o) is True
    assert standin.judge(standin.seen(installed, o, with_globals), o) is False

    def neither(self, batch):  # calls the model another way
        if not self.enabled:
            return None
        return self.model(batch, labels=batch.labels, mask=None)

    with pytest.raises(Mismatch, match="behaves like neither"):
        standin.judge(standin.seen(neither, o, with_globals), o)

    o_no_control = Observation.from_json({**o.__dict__, "control_facts": ()})

    def gone(self, batch):  # never calls the model
        return None

    with pytest.raises(Mismatch, match="the control call no longer does"):
        standin.judge(standin.seen(gone, o, with_globals), o)
    with pytest.raises(Mismatch, match="the call the versions differ at is gone"):
        standin.judge(standin.seen(gone, o_no_control, with_globals), o_no_control)

    def changed_control(self, batch):
        self.log("x")
        return installed(self, batch)

    o2 = Observation.from_json({**o.__dict__, "control_facts": ("call self.other#0",)})
    with pytest.raises(Mismatch, match=r"control call no longer does 'call self\.other#0'"):
        standin.judge(standin.seen(changed_control, o2, with_globals), o2)


def test_recorders_stand_in_for_callees_that_touch_a_gpu(tmp_path: Path) -> None:
    """A module-global callee whose source allocates on CUDA becomes a recorder; a pure one
    stays real. The module is written here, named like megatron's."""
    source = textwrap.dedent(
        """
        import torch

        def scratch(n):
            return torch.empty(n, device=torch.cuda.current_device())

        def double(n):
            return 2 * n

        def target(self):
            return scratch(double(self.n))
        """
    )
    (tmp_path / "megatron_fixture_toy.py").write_text(source)
    sys.path.insert(0, str(tmp_path))
    try:
        import megatron_fixture_toy as toy

        recorders = explore.recorders_for([toy.target], vars(toy))
        assert recorders == ("scratch",)
        run = _run(toy.target, recorders=recorders, module="megatron_fixture_toy")
        # double ran for real; scratch's argument is recorded by its own parameter name
        assert "call scratch#0 n=<(2 * self.n)>" in run.facts
        assert run.outcome.startswith("return <scratch#0()>")
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("megatron_fixture_toy", None)


def _passes_on_a_fixed_backward() -> None:
    """A test as a pull request would write it: it names the class at module level."""
    assert GeLUFunction.backward(None, 3) == (3, 3)


def test_route_a_binds_a_subclass_whose_method_is_the_one_under_judgement() -> None:
    from megatron.core.fusions.fused_bias_gelu import GeLUFunction

    name, value = standin.test_binding(
        "megatron.core.fusions.fused_bias_gelu", "GeLUFunction.backward", lambda ctx, g: (g, g)
    )
    assert name == "GeLUFunction" and issubclass(value, GeLUFunction) and value is not GeLUFunction
    assert isinstance(vars(value)["backward"], staticmethod)  # as the class holds it
    assert isinstance(vars(GeLUFunction)["backward"], staticmethod)  # the live one untouched
    test = _passes_on_a_fixed_backward
    assert standin.run_test(test, name, value, with_globals) == "passed"
    # The installed backward reads ctx.saved_tensors of None: an error, not a failure.
    outcome = standin.run_test(test, name, GeLUFunction, with_globals)
    assert outcome.startswith("error AttributeError")


def _divide_raises_on_a_remainder() -> None:
    """A test as #101 of the fixture would write it, with ``pytest.raises``."""
    import pytest

    with pytest.raises(ValueError):
        divide(7, 2)  # noqa: F821 - bound by run_test, as route a binds the target


def _skips() -> None:
    import pytest

    pytest.skip("needs a GPU")


def test_route_a_takes_pytest_raises_that_sees_nothing_raised_for_a_failure() -> None:
    """``pytest.raises`` with nothing raised raises ``Failed``, a ``BaseException``: it is
    the test failing, not the end of the process that runs it (the sniff child died)."""

    def whole(numerator: int, denominator: int) -> float:
        return numerator / denominator

    def refuses(numerator: int, denominator: int) -> int:
        if numerator % denominator:
            raise ValueError("remainder")
        return numerator // denominator

    test = _divide_raises_on_a_remainder
    assert standin.run_test(test, "divide", whole, with_globals) == "failed"
    assert standin.run_test(test, "divide", refuses, with_globals) == "passed"
    assert standin.run_test(_skips, "divide", whole, with_globals) == "error Skipped: needs a GPU"


# ---- routes that see the bug (issue 44 item 3) ---------------------------------------------


def _round_up(value, multiple):  # type: ignore[no-untyped-def]
    """As megatron's round_up_to_nearest_multiple: a zero multiple raises in here."""
    import math

    return math.ceil(value / multiple) * multiple


def _needs_a_gpu(value, multiple):  # type: ignore[no-untyped-def]
    raise RuntimeError("Found no NVIDIA driver on your system")


def _needs_a_module(value, multiple):  # type: ignore[no-untyped-def]
    import megatron_fixture_absent  # noqa: F401

    return value


def _rounds_a_zero_multiple_to_the_value() -> None:
    """A test as a pull request would write it: it calls the target, which raises."""
    assert round_up(5, 0) == 5  # noqa: F821 - bound by run_test, as route a binds the target


def _raises_itself() -> None:
    round_up(5, 1)  # noqa: F821
    raise ZeroDivisionError("in the test, not in the target")


def test_route_a_takes_an_exception_raised_inside_the_target_for_a_failure() -> None:
    """pytest calls a test FAILED when the code under test raises: on the installed code
    that is the bug (not an environment that lacks something)."""
    test = _rounds_a_zero_multiple_to_the_value
    outcome = standin.run_test(test, "round_up", _round_up, with_globals, _round_up.__code__)
    assert outcome.startswith("failed: raised ZeroDivisionError inside _round_up")
    assert standin.is_failure(outcome)
    # Without the target's code, it is the error it was.
    assert standin.run_test(test, "round_up", _round_up, with_globals).startswith(
        "error ZeroDivisionError"
    )
    # Raised by the test itself, or where the environment lacks something: an error.
    raised = standin.run_test(
        _raises_itself, "round_up", _round_up, with_globals, _round_up.__code__
    )
    assert raised.startswith("error ZeroDivisionError")
    for lacking in (_needs_a_gpu, _needs_a_module):
        said = standin.run_test(test, "round_up", lacking, with_globals, lacking.__code__)
        assert said.startswith("error "), said


def test_a_run_time_sniff_of_route_a_reads_a_raise_inside_the_target_as_needed() -> None:
    entry: standin.SniffEntry = {"route": "a", "target": "round_up", "test": "t"}
    assert standin.decide({"test": "failed: raised ZeroDivisionError inside f: x"}, entry) is False
    assert standin.decide({"test": "passed"}, entry) is True
    with pytest.raises(Mismatch):
        standin.decide({"test": "error ImportError: no module"}, entry)


def _reads_a_flag(self, cfg):  # type: ignore[no-untyped-def]
    if getattr(cfg, "use_cache", False):
        return self.cached()
    return self.plain()


def _fixed_reads_a_flag(self, cfg):  # type: ignore[no-untyped-def]
    if getattr(cfg, "use_cache", False):
        return self.cached(cfg.cache_size)
    return self.plain()


def _asks_hasattr(self, cfg):  # type: ignore[no-untyped-def]
    return self.cached() if hasattr(cfg, "cache") else None


def _fixed_asks_hasattr(self, cfg):  # type: ignore[no-untyped-def]
    return self.cached(cfg.cache) if hasattr(cfg, "cache") else None


@pytest.mark.parametrize(
    ("installed", "fixed", "truths"),
    [
        (_reads_a_flag, _fixed_reads_a_flag, {"has cfg.use_cache": True, "cfg.use_cache": True}),
        (_asks_hasattr, _fixed_asks_hasattr, {"has cfg.cache": True}),
    ],
)
def test_the_search_tries_an_attribute_read_with_a_default_both_ways(
    installed, fixed, truths
) -> None:
    """``getattr(cfg, "x", False)`` and ``hasattr``: the fix is behind the attribute being
    there, which a stand-in says only when the search asks it to."""
    found = explore.search(
        installed, fixed, target="f", module="m", recorders=(), with_globals=with_globals
    )
    assert found is not None
    assert {k: v for k, v in found.observation.main["truths"].items() if v} == truths
    o = found.observation
    assert standin.judge(standin.seen(fixed, o, with_globals), o) is True
    assert standin.judge(standin.seen(installed, o, with_globals), o) is False


def test_a_class_that_exists_only_with_transformer_engine_says_so_in_one_line() -> None:
    """Transformer Engine is not installed here: ``TELinear`` is then a stand-in of the
    module's, with no ``forward`` of its own (the sniff said ``KeyError: 'forward'``)."""
    from backports.megatron.authoring.from_pr import sniff_child

    target = {
        "module": "megatron.core.extensions.transformer_engine",
        "attribute": "TELinear.forward",
    }
    answer = sniff_child.target_answer({}, target, None)  # type: ignore[arg-type]
    assert answer["route"] is None
    assert answer["tried"] == [
        "TELinear.forward: TELinear exists only with Transformer Engine, which is not installed "
        "here: no route can run it (derive where Transformer Engine is installed, or write the "
        "sniff by hand)"
    ]


CALLEES_TOY = """
import math

import torch

from toylib_fixture import AutoThing, ThingError


def _carried(x):
    return x


def reduce_installed(input_, group):
    if group.size() == 1:
        return input_
    torch.distributed.all_reduce(input_.contiguous(), group=group)
    return input_


def reduce_fixed(input_, group):
    if group.size() == 1:
        return input_
    input_ = input_.contiguous()
    torch.distributed.all_reduce(input_, group=group)
    return input_


def zeros_installed(param, use_decoupled_grad=False):
    grad = param.grad
    total = grad.numel() - torch.count_nonzero(grad)
    total = torch.tensor([total], dtype=torch.float, device="cpu")
    torch.distributed.all_reduce(total)
    return total.item(), torch.zeros(2).sum().item()


def zeros_fixed(param, use_decoupled_grad=False):
    grad = param.decoupled_grad if use_decoupled_grad else param.grad
    total = grad.numel() - torch.count_nonzero(grad)
    total = torch.tensor([total], dtype=torch.float, device="cpu")
    torch.distributed.all_reduce(total)
    return total.item(), torch.zeros(2).sum().item()


class Scaler:
    scale = None

    @staticmethod
    def set_scale(value):
        Scaler.scale = value


def scale_installed(config, n):
    return n


def scale_fixed(config, n):
    from megatron_fixture_callees import Scaler

    if config.use_scaler:
        Scaler.set_scale(n)
    return n


def load_installed(self, path, merges=None):
    try:
        self.thing = AutoThing.from_pretrained(path, merge_files=merges, floor=math.floor(1.5))
    except ThingError:
        self.thing = None
    return _carried(self.thing)


def load_fixed(self, path, merges=None):
    try:
        self.thing = AutoThing.from_pretrained(path, merges_file=merges, floor=math.floor(1.5))
    except ThingError:
        self.thing = None
    return _carried(self.thing)
"""
TOYLIB = """
class ThingError(Exception):
    pass


class AutoThing:
    @classmethod
    def from_pretrained(cls, path, **kwargs):
        raise OSError("would download " + repr(path))
"""


@pytest.fixture
def callees_toy(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A module named like megatron's that calls ``torch.distributed`` and a library class
    (``toylib_fixture``, written here: not the standard library), beside a helper of its own."""
    (tmp_path / "megatron_fixture_callees.py").write_text(textwrap.dedent(CALLEES_TOY))
    (tmp_path / "toylib_fixture.py").write_text(textwrap.dedent(TOYLIB))
    sys.path.insert(0, str(tmp_path))
    try:
        import megatron_fixture_callees as toy

        yield toy
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("megatron_fixture_callees", None)
        sys.modules.pop("toylib_fixture", None)


def test_callee_recorders_take_process_groups_and_library_callees(callees_toy) -> None:
    """Route c's last try: ``torch``'s ``distributed`` and ``cuda`` (the rest of torch stays
    real), a library class; not the standard library, an exception class, nor a helper the
    vendored (fixed) module defines itself."""
    toy = callees_toy
    functions = [toy.reduce_installed, toy.reduce_fixed, toy.load_installed, toy.load_fixed]
    assert explore.recorders_for(functions, vars(toy)) == ()
    found = explore.callee_recorders(functions, vars(toy))
    assert found == ("AutoThing", "torch.*", "torch.cuda", "torch.distributed")
    assert "_carried" not in found and "ThingError" not in found and "math.*" not in found


@pytest.mark.parametrize(
    ("installed", "fixed", "differs_at"),
    [
        ("reduce_installed", "reduce_fixed", "return <input_.contiguous#0()>"),
        ("load_installed", "load_fixed", "call AutoThing.from_pretrained#0 merges_file=None"),
        ("scale_installed", "scale_fixed", "call Scaler.set_scale#0 value=<n>"),
        (
            "zeros_installed",
            "zeros_fixed",
            "call torch.count_nonzero#0 arg0=<param.decoupled_grad>",
        ),
    ],
)
def test_a_fix_in_what_a_callee_is_handed_is_found_with_callees_recorded(
    callees_toy, installed, fixed, differs_at
) -> None:
    """On CPU ``torch.distributed.all_reduce`` and a download raise on stand-ins in both
    versions: the plain search sees nothing; with the callees recorded the versions hand
    them (or return) different things, and the sniff judges both versions."""
    toy = callees_toy
    old, new = getattr(toy, installed), getattr(toy, fixed)
    kwargs = {"target": installed, "module": toy.__name__, "with_globals": with_globals}
    plain = explore.recorders_for([old, new], vars(toy))
    assert explore.search(old, new, recorders=plain, seconds=5.0, **kwargs) is None
    toy.Scaler.scale = None  # the plain search ran the real one
    recorders = explore.callee_recorders([old, new], vars(toy))
    found = explore.search(old, new, recorders=recorders, seconds=10.0, **kwargs)
    assert found is not None
    o = found.observation
    assert differs_at in o.fixed, o
    assert standin.judge(standin.seen(new, o, with_globals), o) is True
    assert standin.judge(standin.seen(old, o, with_globals), o) is False
    assert toy.Scaler.scale is None  # imported in the body: recorded, never set for real


def test_isinstance_of_a_recorded_class_is_a_question_the_search_can_flip() -> None:
    def kind(x, Tensor):  # a recorded class, as a module global would be
        return "one" if isinstance(x, Tensor) else "many"

    setting = Setting(arguments={}, truths={"(isinstance <x> Tensor)": True})
    assert _run(kind).outcome == "return 'many'"
    assert _run(kind, setting).outcome == "return 'one'"
    assert _run(kind).asked == ["(isinstance <x> Tensor)"]


def test_a_recorded_call_is_the_same_fact_positional_or_by_keyword(callees_toy) -> None:
    """A recorder stands in for a real callee: what it was handed is recorded by the
    callee's parameter names, so a fix that also rewrites ``f(x, g)`` as ``f(x, group=g)``
    is not told apart by that (a sniff of spelling); a callee with no signature that
    fits is recorded as handed."""
    toy = callees_toy

    def positional(input_, group):
        torch.distributed.all_reduce(input_, None, group)
        return toy.AutoThing.from_pretrained(input_, 1, 2, extra=3)

    def by_keyword(input_, group):
        torch.distributed.all_reduce(tensor=input_, group=group, op=None)
        return toy.AutoThing.from_pretrained(input_, 1, 2, extra=3)

    recorders = ("torch.distributed",)
    facts = [
        set(_run(f, recorders=recorders, module=toy.__name__).facts)
        for f in (positional, by_keyword)
    ]
    assert facts[0] == facts[1]
    assert "call torch.distributed.all_reduce#0 group=<group>" in facts[0]


def test_a_torch_function_runs_for_real_unless_handed_a_stand_in(callees_toy) -> None:
    """``torch.*``: a function handed only real values runs (its tensors are real, and no
    fact: reordering real tensor arithmetic is no difference); one handed a stand-in, in a
    list too, is recorded (no real one takes it); classes stay themselves."""
    toy = callees_toy

    def mixed(x):
        real = torch.zeros(2).sum().item()
        made = torch.tensor([x], dtype=torch.float)
        return real, made, isinstance(made, torch.Tensor)

    run = _run(mixed, recorders=("torch.*",), module=toy.__name__)
    assert run.outcome == "return (0.0, <torch.tensor#0()>, False)"
    assert {f for f in run.facts if "zeros" in f or "sum" in f} == set()
    assert "call torch.tensor#0 arg0=[<x>]" in run.facts  # a builtin: no signature
    assert "call torch.tensor#0 dtype=torch.float32" in run.facts


# ---- a numeric argument's edges, a CUDA allocation, a crash preferred (#5530's shape) -----


def _norm_installed(grads, norm_type=2):  # type: ignore[no-untyped-def]
    """As megatron's ``get_grad_norm_fp32`` before #5530: the inf-norm of no gradients
    raises in ``max``; the p-norm path allocates a dummy buffer on the GPU."""
    import math

    norm_type = float(norm_type)
    if norm_type == math.inf:
        total = max(g for g in grads)
        return torch.tensor([float(total)], device="cuda")
    torch.zeros(1, dtype=torch.int32, device="cuda")
    return torch.zeros(1, device="cuda")


def _norm_fixed(grads, norm_type=2):  # type: ignore[no-untyped-def]
    """After: the inf-norm of no gradients is 0.0; no dummy buffer."""
    import math

    norm_type = float(norm_type)
    if norm_type == math.inf:
        total = max((g for g in grads), default=0.0)
        return torch.tensor([float(total)], device="cuda")
    return torch.zeros(1, device="cuda")


def test_a_call_that_asks_for_a_cuda_device_is_recorded_on_every_machine() -> None:
    run = _run(_norm_fixed, recorders=(f"torch.{standin.HANDED_A_STAND_IN}",), module=__name__)
    assert "call torch.zeros#0 device='cuda'" in run.facts, run.facts
    assert run.outcome.startswith("return <torch.zeros#0()>")  # no CUDA error on CPU


def test_a_numeric_default_is_tried_at_its_edges_and_the_crash_the_fix_removes_is_kept() -> None:
    """Both versions differ at the default input only in a dummy buffer (how the fix is
    written); the bug is the inf-norm of no gradients, reached only with ``norm_type``
    infinite (a stand-in cannot pass ``float()``). The crash is the sniff kept."""
    found = explore.search(
        _norm_installed,
        _norm_fixed,
        target="get_grad_norm_fp32",
        module=__name__,
        recorders=(f"torch.{standin.HANDED_A_STAND_IN}",),
        with_globals=with_globals,
    )
    assert found is not None and not found.clean
    o = found.observation
    assert o.main["arguments"] == {"norm_type": "inf"}, o.main
    assert any(f.startswith("raise ValueError") for f in o.needed), o.needed
    assert standin.judge(standin.seen(_norm_installed, o, with_globals), o) is False
    assert standin.judge(standin.seen(_norm_fixed, o, with_globals), o) is True


def test_a_marker_dunder_read_with_a_default_is_explored_and_a_protocol_name_is_not() -> None:
    """megatron marks its FSDP parameters ``param.__fsdp_param__`` (#4802's branch): a read
    of it with a default is a choice the search tries both ways. Protocol names that
    Python and torch probe objects for never are: a stand-in has none of them."""

    def reads(param):  # type: ignore[no-untyped-def]
        marked = getattr(param, "__fsdp_param__", False)
        probed = hasattr(param, "__torch_function__"), hasattr(param, "__wrapped__")
        return bool(marked), probed

    setting = Setting()
    run = _run(reads, setting)
    assert run.missed == ["param.__fsdp_param__"], run.missed
    assert run.outcome == "return (False, (False, False))"
    marker = "param.__fsdp_param__"
    there = Setting(truths={standin.present(marker): True, marker: True})
    assert _run(reads, there).outcome.startswith("return (True,")
