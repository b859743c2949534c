"""``--from-pr`` carries the shapes small fixes have (fixture repository, installed 0.19.2):
inert noise is dropped and listed (#121), a method and a class attribute the fix adds are
added through the added-attribute kind (#122), a new module constant and import come along
(#123); every refusal names one reason, and the docs list them all."""

import ast
import re
import types
from pathlib import Path

import megatron.core.utils as utils
import pytest

from backports.megatron.authoring.from_pr.budget import check_budget
from backports.megatron.authoring.from_pr.clone import open_clone
from backports.megatron.authoring.from_pr.errors import Reason, Refused
from backports.megatron.authoring.from_pr.inert import added_class_attributes, why_inert
from backports.megatron.authoring.from_pr.locate import installed_distribution, locate
from backports.megatron.authoring.from_pr.model import Located, Symbol
from backports.megatron.authoring.from_pr.resolve import resolve_pull_request
from backports.megatron.authoring.from_pr.symbols import changed_symbols
from backports.megatron.authoring.from_pr.units import map_units
from backports.megatron.authoring.from_pr.vendor import (
    VendoredCode,
    _new_imports,
    vendor,
    with_module_imports,
)
from backports.megatron.kinds import kind_of
from backports.megatron.kinds.added import AddedAttribute
from backports.megatron.kinds.install import uninstall
from backports.megatron.kinds.module_attribute import ModuleAttribute
from backports.megatron.model import Target
from tests.from_pr_fixture import UTILS, Upstream, shared
from tests.installing import install
from tests.paths import ROOT

DOCS = ROOT / "docs" / "from-pr.md"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    return shared(tmp_path_factory)


def _located(upstream: Upstream, number: int) -> tuple[list[Located], object, object]:
    clone = open_clone(str(upstream.path))
    pr = resolve_pull_request(clone, number)
    symbols = changed_symbols(clone, pr).symbols
    return locate(symbols, clone, pr, installed_distribution()), clone, pr


def _vendor(upstream: Upstream, number: int) -> VendoredCode:
    located, clone, pr = _located(upstream, number)
    return vendor(located, clone, pr, installed_distribution(), repo_url="https://x.org/m")


# ---- inert changes: dropped, and listed --------------------------------------------------


def test_inert_noise_beside_a_one_line_fix_is_dropped_and_the_fix_carried(upstream) -> None:
    """#121: the module docstring, another function's docstring, a comment and a bare
    annotation beside a one-line fix: one symbol carried, four dropped with why."""
    located, _, _ = _located(upstream, 121)
    kinds = {loc.symbol.qualname: (loc.symbol.kind, loc.symbol.tags[0]) for loc in located}
    assert kinds == {
        "<module:3>": ("inert", "inert: module docstring only"),
        "round_up_to_nearest_multiple": ("function", "function"),
        "get_model_type": ("inert", "inert: comments or blank lines only"),
        "GlobalMemoryBuffer": ("inert", "inert: bare annotation in a plain class only"),
        "is_submodule": ("inert", "inert: docstring only"),
    }
    figures = check_budget(located)  # no "module statement" refusal any more
    assert (figures.symbols, figures.inert, figures.uncarriable) == (1, 4, ())
    vendored = _vendor(upstream, 121)
    assert [t.attribute for t in vendored.targets] == ["round_up_to_nearest_multiple"]
    assert "return -(-value // multiple) * multiple" in vendored.text
    assert "is_submodule" not in vendored.text and "get_model_type" not in vendored.text


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ('def f():\n    """A."""\n    return 1\n', 'def f():\n    """B."""\n    return 1\n',
         "docstring only"),
        ("def f():\n    return 1\n", "def f():\n    # one\n\n    return 1\n",
         "comments or blank lines only"),
        ("class C:\n    x = 1\n", "class C:\n    y: int\n    x = 1\n",
         "bare annotation in a plain class only"),
        ("@dataclass\nclass C:\n    x = 1\n", "@dataclass\nclass C:\n    y: int\n    x = 1\n",
         None),  # a dataclass field: not inert
        ("class C(NamedTuple):\n    x: int\n", "class C(NamedTuple):\n    x: int\n    y: int\n",
         None),
        ("def f():\n    return 1\n", "def f():\n    return 2\n", None),
        ('def f():\n    """A."""\n', 'def f():\n    """B."""\n    return 2\n', None),
    ],
)  # fmt: skip
def test_why_inert_tells_noise_from_code(old: str, new: str, why: str | None) -> None:
    qualname = "C" if "class" in old else "f"
    kind = "class body" if "class" in old else "function"
    sides = (old, map_units(old)), (new, map_units(new))
    assert why_inert(qualname, kind, *sides) == why


def test_a_module_function_the_fix_deletes_is_left_in_place(upstream) -> None:
    """#126 deletes ``get_model_xattn`` beside its fix: the backport carries the fix and
    leaves the deleted function be (listed as inert), instead of refusing the removal."""
    located, _, _ = _located(upstream, 126)
    kinds = {loc.symbol.qualname: (loc.symbol.kind, loc.symbol.tags[0]) for loc in located}
    assert kinds["get_model_xattn"] == ("inert", "inert: removed upstream, left in place")
    assert kinds["get_model_type"] == ("function", "function")
    assert check_budget(located).uncarriable == ()
    assert [t.attribute for t in _vendor(upstream, 126).targets] == ["get_model_type"]


@pytest.mark.parametrize(
    ("new", "kind"),
    [
        ("def keep():\n    return 1\n", "inert"),  # the class and its method deleted
        ("class Gone:\n    pass\n\n\ndef keep():\n    return 1\n", "removed"),  # the method only
    ],
)
def test_a_method_deleted_with_its_class_is_left_in_place_one_deleted_alone_is_not(
    new: str, kind: str
) -> None:
    from backports.megatron.authoring.from_pr.symbols import _symbol, _Tally
    from backports.megatron.authoring.from_pr.units import Unit

    old = "class Gone:\n    def m(self):\n        return 1\n\n\ndef keep():\n    return 1\n"
    tally = _Tally(Unit("Gone.m", "method", ("method",)), old=True)
    assert _symbol(tally, (old, map_units(old)), (new, map_units(new))).kind == kind


# ---- a method and a class attribute the fix adds ---------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "added"),
    [
        ("class C:\n    x = 1\n", "class C:\n    x = 1\n    Y = (1,)\n", ["Y"]),
        ("class C(Base):\n    x = 1\n", 'class C(Base):\n    """D."""\n    x = 1\n    y = 2\n',
         ["y"]),
        ("class C:\n    x = 1\n", "class C:\n    x = 2\n    y = 2\n", None),  # x changed
        ("@dataclass\nclass C:\n    x: int = 1\n",
         "@dataclass\nclass C:\n    x: int = 1\n    y: int = 2\n", None),  # a field
        ("class C(Enum):\n    A = 1\n", "class C(Enum):\n    A = 1\n    B = 2\n", None),
        ("class C(metaclass=M):\n    a = 1\n", "class C(metaclass=M):\n    a = 1\n    b = 2\n",
         None),
    ],
)  # fmt: skip
def test_only_plain_class_attribute_additions_are_carried(old, new, added) -> None:
    found = added_class_attributes("C", (old, map_units(old)), (new, map_units(new)))
    assert (None if found is None else [name for name, _ in found]) == added


def test_a_new_method_and_class_attribute_are_carried_as_added_names(upstream) -> None:
    """#122: ``__str__`` calls a method the pull request adds, which reads a class
    attribute it adds: ``__str__`` is the target, the other two are added at install."""
    located, _, _ = _located(upstream, 122)
    kinds = {loc.symbol.qualname: (loc.symbol.kind, loc.status) for loc in located}
    assert kinds == {
        "_ValueWithRank._PLAIN_UNITS": ("new class attribute", "new"),
        "_ValueWithRank._shown_value": ("new method", "new"),
        "_ValueWithRank.__str__": ("method", "identical"),
    }
    vendored = _vendor(upstream, 122)
    assert [t.attribute for t in vendored.targets] == ["_ValueWithRank.__str__"]
    added = {t.attribute: (t.added, t.replacement) for t in vendored.added}
    assert added == {
        "_ValueWithRank._PLAIN_UNITS": ("class attribute", "_added__ValueWithRank__PLAIN_UNITS"),
        "_ValueWithRank._shown_value": ("method", "_shown_value"),
    }
    assert '_added__ValueWithRank__PLAIN_UNITS = ("",)' in vendored.text
    assert vendored.origin == "handwritten"  # the attribute is written beside the pieces


def test_the_added_names_install_and_revert_through_the_kinds(upstream) -> None:
    """The vendored module of #122, installed as its plugin would: ``str()`` shows the
    fixed text while installed, the installed one after revert, and nothing is left."""
    vendored = _vendor(upstream, 122)
    module = types.ModuleType("vendored_122")
    exec(compile(vendored.text, "vendored_122.py", "exec"), module.__dict__)
    targets: list[Target] = [
        Target("megatron-core", ("megatron.core.utils",), "_ValueWithRank.__str__", ("self",))
    ]
    targets += [
        AddedAttribute("megatron-core", ("megatron.core.utils",), t.attribute,
                       replacement=t.replacement, wrap=t.wrap)
        for t in vendored.added
    ]  # fmt: skip
    parts = []
    for target in targets:
        kind = kind_of(target)
        resolved = kind.resolve(target, "test-shapes-122")
        assert kind.refusal(target, resolved, []) is None
        parts.append((target, resolved, kind.replacement(target, module)))
    assert str(utils._ValueWithRank(3, 0)) == "3.00/0"  # the installed release's
    try:
        install("test-shapes-122", parts)
        assert str(utils._ValueWithRank(3, 0)) == "3/0"  # the pull request's test passes
        assert str(utils._ValueWithRank(3, 0, "ms")) == "3.00ms/0"
    finally:
        uninstall("test-shapes-122")
    assert str(utils._ValueWithRank(3, 0)) == "3.00/0"
    assert not {"_shown_value", "_PLAIN_UNITS"} & set(vars(utils._ValueWithRank))


def test_a_name_the_installed_class_already_has_is_refused(upstream) -> None:
    """The fix "adds" ``__str__``, which the installed class defines: never overwritten."""
    symbol = Symbol(UTILS, "_ValueWithRank.__str__", "new method", ("new method",), 3)
    clone = open_clone(str(upstream.path))
    pr = resolve_pull_request(clone, 122)
    (loc,) = locate((symbol,), clone, pr, installed_distribution())
    assert loc.status == "drifted" and "already exists" in loc.how
    with pytest.raises(Refused, match="already exists") as caught:
        vendor([loc], clone, pr, installed_distribution(), repo_url="x")
    assert caught.value.reason is Reason.SHAPE


# ---- module-level additions ---------------------------------------------------------------------


def test_a_new_constant_and_import_come_along_with_a_drifted_function(upstream) -> None:
    """#123: ``is_submodule`` (its docstring changed since the release: the same code) reads
    a constant and a name imported at module level, both new: the vendored module has both."""
    located, _, _ = _located(upstream, 123)
    status = {loc.symbol.qualname: loc.status for loc in located if loc.symbol.kind != "comment"}
    assert status["is_submodule"] == "identical" and status["_STRICT_DEFAULT"] == "new"
    vendored = _vendor(upstream, 123)
    tree = ast.parse(vendored.text)
    imports = [ast.unparse(s) for s in tree.body if isinstance(s, ast.ImportFrom)]
    assert "from functools import partial as _partial" in imports
    assert "_STRICT_DEFAULT" in vendored.carried and "_partial" not in vendored.reads
    module = types.ModuleType("vendored_123")
    module.__dict__["__name__"] = "vendored_123"
    exec(compile(vendored.text, "vendored_123.py", "exec"), module.__dict__)
    module.__target_module__ = "megatron.core.utils"
    import torch

    layer = torch.nn.Linear(1, 1)
    assert module.is_submodule(layer, layer) is False  # strict by the new default
    assert module.is_submodule(layer, layer, strict=False) is True


def test_module_state_a_carried_helper_keeps_lives_in_the_vendored_module(upstream) -> None:
    """#125: a new helper assigns a new module counter (``global``): both are carried, and
    the counter lives in the vendored module (the installed module never had it)."""
    vendored = _vendor(upstream, 125)
    assert set(vendored.carried) == {"_CONFIG_READS", "_count_config_read"}
    module = types.ModuleType("vendored_125")
    exec(compile(vendored.text, "vendored_125.py", "exec"), module.__dict__)
    assert module._count_config_read() == 1 and module._count_config_read() == 2
    assert module._CONFIG_READS == 2 and not hasattr(utils, "_CONFIG_READS")


def test_a_changed_module_constant_is_replaced_through_the_module_attribute_kind(
    upstream,
) -> None:
    """#127 changes a module constant and the function that reads it: the constant is a
    module-attribute target, replaced on the installed module at install, put back at
    revert (the very object)."""
    located, _, _ = _located(upstream, 127)
    kinds = {loc.symbol.qualname: (loc.symbol.kind, loc.status) for loc in located}
    assert kinds["_VALID_DSA_KERNEL_BACKENDS"] == ("changed constant", "identical")
    vendored = _vendor(upstream, 127)
    assert [(t.attribute, t.added) for t in vendored.added] == [
        ("_VALID_DSA_KERNEL_BACKENDS", "constant")
    ]
    module = types.ModuleType("vendored_127")
    exec(compile(vendored.text, "vendored_127.py", "exec"), module.__dict__)
    target = ModuleAttribute(
        "megatron-core", ("megatron.core.utils",), "_VALID_DSA_KERNEL_BACKENDS"
    )
    kind = kind_of(target)
    original = utils._VALID_DSA_KERNEL_BACKENDS
    try:
        install("test-shapes-127", [(target, kind.resolve(target, "test-shapes-127"),
                                     kind.replacement(target, module))])  # fmt: skip
        assert utils._VALID_DSA_KERNEL_BACKENDS == ("none", "tilelang", "cudnn", "flashmla")
    finally:
        uninstall("test-shapes-127")
    assert utils._VALID_DSA_KERNEL_BACKENDS is original


# ---- same-named targets ---------------------------------------------------------------------


def test_two_inits_in_two_modules_share_one_plugin_under_names_of_their_own(upstream) -> None:
    """#124 changes two ``__init__``s: each is defined in the vendored module under a name
    of its own, which its target names (the refusal "both named __init__" is gone)."""
    vendored = _vendor(upstream, 124)
    replacements = {t.attribute: t.replacement for t in vendored.targets}
    assert replacements == {
        "GlobalMemoryBuffer.__init__": "utils_GlobalMemoryBuffer___init__",
        "LayerWiseDistributedOptimizer.__init__":
            "layer_wise_optimizer_LayerWiseDistributedOptimizer___init__",
    }  # fmt: skip
    defined = {n.name for n in ast.parse(vendored.text).body if isinstance(n, ast.FunctionDef)}
    assert set(replacements.values()) <= defined and "__init__" not in defined


# ---- the named reasons ---------------------------------------------------------------------------


def test_every_reason_has_a_code_and_a_next_step_and_the_docs_list_it() -> None:
    doc = DOCS.read_text(encoding="utf-8")
    codes = [reason.code for reason in Reason]
    assert len(set(codes)) == len(codes)
    for reason in Reason:
        assert re.fullmatch(r"[a-z]+(-[a-z]+)*", reason.code) and reason.next_step
        assert f"| `{reason.code}` |" in doc, reason.code


def test_a_drifted_symbol_merged_into_the_installed_text_gets_the_new_imports() -> None:
    """The installed text lacks the imports the pull request adds: the merged source gets
    them (the vendored module repeats them), and only them."""
    base = "import os\nfrom a import b\n\n\ndef f():\n    return b\n"
    new = (
        "import os\nfrom a import b\nfrom c import d as e\nimport g.h\n\n\ndef f():\n    return e\n"
    )
    assert _new_imports(base, new) == "from c import d as e\nimport g.h\n"
    assert _new_imports(base, base) == ""


def test_the_new_imports_of_a_merged_method_go_to_module_level_not_into_its_class() -> None:
    """#4990 (a method of a class, drifted, with a new import) crashed with an
    IndentationError: the import lines were put where the method starts, inside the class."""
    text = (
        '"""Doc."""\nimport os\n\n\nclass A:\n    x = 1\n\n    def f(self):\n'
        "        return e\n\n    def __init__(self):\n        pass\n"
    )
    done = with_module_imports(text, "from c import d as e\n")
    assert done.splitlines()[:3] == ['"""Doc."""', "import os", "from c import d as e"]
    ast.parse(done)
    only_doc = '"""Doc."""\n\n\ndef f():\n    return e\n'
    assert with_module_imports(only_doc, "import g\n").splitlines()[:2] == [
        '"""Doc."""',
        "import g",
    ]
    assert with_module_imports("def f():\n    pass\n", "import g\n").startswith("import g\ndef f")
    assert with_module_imports(text, "") == text


# ---- whole derivations (slow) ------------------------------------------------------------------

_WHOLE = pytest.mark.slow(
    reason="derives, proves (contract kit, backports check in children) and writes a whole "
    "plugin from the fixture: minutes on 2 cores"
)


@pytest.fixture
def _scratch_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The derivation's scratch folders and its children's temporary files stay here."""
    import tempfile

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _new(upstream: Upstream, number: int, dest: Path) -> int:
    from backports.megatron import cli

    argv = ["new", "--from-pr", str(number), "--repo", str(upstream.path), "--dest", str(dest)]
    return cli.main(argv)


@_WHOLE
@pytest.mark.usefixtures("_scratch_here")
def test_a_one_line_fix_beside_inert_noise_is_proven(upstream, tmp_path, capsys) -> None:
    """#121 end to end: proven by its own CPU test; the report lists the dropped noise."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 121, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "dropped as inert (nothing at run time), 4:" in out
    assert f"  {UTILS}::is_submodule  [docstring only]" in out
    assert "backports check --only mlm-pr-121: exit 0" in out
    entry = (dest / "mlm_pr_121_backport" / "entry.py").read_text()
    assert "attribute='round_up_to_nearest_multiple'" in entry and "is_submodule" not in entry


@_WHOLE
@pytest.mark.usefixtures("_scratch_here")
def test_a_fix_adding_a_method_and_class_attribute_is_proven(upstream, tmp_path, capsys) -> None:
    """#122 end to end: the plugin's entry adds the method and the class attribute
    (AddedAttribute targets), and the contract kit's apply/revert and check pass."""
    dest = tmp_path / "plugin"
    assert _new(upstream, 122, dest) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "backports check --only mlm-pr-122: exit 0" in out
    assert "added to the installed _ValueWithRank at install, removed at revert" in out
    entry = (dest / "mlm_pr_122_backport" / "entry.py").read_text()
    assert "AddedAttribute(" in entry and "attribute='_ValueWithRank._shown_value'" in entry
    assert "replacement='_added__ValueWithRank__PLAIN_UNITS'" in entry


def test_upstreams_invalid_escapes_raise_no_warning_here(recwarn) -> None:
    """Upstream code with ``"\\-"`` (a SyntaxWarning) is read quietly: the user's terminal
    is not told of upstream's lint."""
    old = 'def f():\n    return "\\-"\n'
    new = 'def f():\n    """Doc."""\n    return "\\-"\n'
    assert why_inert("f", "function", (old, map_units(old)), (new, map_units(new)))
    assert _new_imports(old, "import os\n" + new) == "import os\n"
    assert not [w for w in recwarn if issubclass(w.category, SyntaxWarning)]


def test_a_line_of_an_optional_import_is_an_import() -> None:
    """A name added to an import inside ``try:`` is an import (ignored: the vendored code
    reads the name live, and the reads check finds it or refuses), not a module statement
    no kind carries."""
    text = "try:\n    from a import (\n        b,\n        c,\n    )\n"
    text += "except ImportError:\n    b = None\n"
    units = map_units(text)
    assert (units.unit(4).kind, units.unit(7).kind) == ("import", "module statement")


def test_a_name_for_a_class_with_slots_is_refused_before_anything_runs(tmp_path) -> None:
    """Where the installed class defines ``__slots__`` the derivation refuses the added
    name (a shape), as the kind would at run time."""
    from backports.megatron.authoring.from_pr.locate import Installed, _added_to_class

    file = tmp_path / "slotted.py"
    file.write_text(
        "class Slotted:\n    __slots__ = ('x',)\n\n    def get(self):\n        return 1\n"
    )
    installed = Installed("megatron-core", "0.19.2", {"megatron/core/slotted.py": file})
    symbol = Symbol("megatron/core/slotted.py", "Slotted.extra", "new method", ("new method",), 2)
    located = _added_to_class(symbol, installed)
    assert located.status == "drifted" and "defines __slots__" in located.how
    plain = Symbol("megatron/core/slotted.py", "Slotted.get", "new method", ("new method",), 2)
    assert "already exists" in _added_to_class(plain, installed).how
