"""backports/megatron/sync/scopes.py and render.py: which names become live look-ups, nothing
else, and the text of the one file they make.

Python's own ``symtable`` is the oracle for scoping: a name is rewritten exactly when the
compiler would read it from the module's globals and the module (not builtins, not an
import the vendored file repeats) provides it.
"""

from __future__ import annotations

import builtins
import symtable

import pytest

from backports.megatron.sync.errors import RewriteError, SourceError
from backports.megatron.sync.render import Piece, Provenance, Vendored, render

MODULE = """\
import functools
import torch
from typing import Optional
from megatron.core.utils import get_pg_size

try:
    from tilelang_kernels import SparseMLA
except ImportError:
    SparseMLA = None

K = 1
len = len  # a module global that shadows a builtin


def helper():
    return K

"""

_TAIL = "\n\ndef later():\n    return f()\n"
_LIVE_HEAD = "def _live_target():\n    return sys.modules[__target_module__]\n\n\n"


def vendor(function: str, module: str = MODULE, symbol: str = "f") -> Vendored:
    provenance = Provenance("https://example.com/up.git", 1, "ab" * 20, "m.py", symbol, "m")
    return one_piece(module + function + _TAIL, symbol, provenance)


def one_piece(source: str, symbol: str, provenance: Provenance) -> Vendored:
    """A backport of one function: a one-piece file."""
    return render({"m.py": source}, [Piece("m.py", "m", symbol)], provenance)


def function_text(vendored: Vendored) -> str:
    return vendored.text.split(_LIVE_HEAD, 1)[1]


def symtable_globals(source: str, symbol: str) -> set[str]:
    """Names the compiler reads as globals anywhere inside ``symbol``'s scopes."""
    top = symtable.symtable(source, "m.py", "exec")
    (table,) = [t for t in top.get_children() if t.get_name() == symbol]
    found: set[str] = set()
    stack = [table]
    while stack:
        current = stack.pop()
        stack += current.get_children()
        found |= {
            s.get_name() for s in current.get_symbols() if s.is_global() and s.is_referenced()
        }
    return found


# (function source, the same function with the names that must become live marked @@)
CASES = {
    "params and locals shadow globals": ("def f(K):\n    x = @@helper()\n    return K + x\n",),
    "a name assigned anywhere in the function is local": (
        "def f():\n    x = 0\n    if x:\n        K = 2\n    return K\n",
    ),
    "a nested function sees the enclosing local": (
        "def f():\n    K = 2\n    def g():\n        return K, @@helper\n    return g\n",
    ),
    "a global statement in a nested function": (
        "def f():\n    K = 2\n    def g():\n        global K\n        return @@K\n"
        "    return g, K\n",
    ),
    "lambda parameters and comprehension targets": (
        "def f(xs):\n    return [@@K * x for x in xs] + list(map(lambda K: K, xs))\n",
    ),
    "a comprehension's first iterable is read outside it": (
        "def f():\n    return [x for x in @@K] + [K for K in range(3)]\n",
    ),
    "a walrus in a comprehension binds in the function": (
        "def f(xs):\n    [(K := x) for x in xs]\n    return K\n",
    ),
    "class bodies do not enclose their methods": (
        "def f():\n"
        "    class C:\n"
        "        K = 3\n"
        "        y = @@helper()\n"
        "        def m(self):\n"
        "            return @@K\n"
        "    return C\n",
    ),
    "a method sees the function's local through the class": (
        "def f():\n"
        "    K = 2\n"
        "    class C:\n"
        "        def m(self):\n"
        "            return K\n"
        "    return C\n",
    ),
    "nonlocal": (
        "def f():\n    K = 1\n    def g():\n        nonlocal K\n        K = 2\n    return g\n",
    ),
    "builtins stay, a module global that shadows one is live": (
        "def f(xs):\n    return @@len(xs), max(xs), isinstance(xs, list)\n",
    ),
    "imports the vendored file repeats stay, megatron's and optional ones are live": (
        "def f(x: torch.Tensor) -> Optional[torch.Tensor]:\n"
        "    if @@SparseMLA is None:\n"
        "        return None\n"
        "    return torch.zeros(@@get_pg_size())\n",
    ),
    "attributes, keywords and strings are not names": (
        'def f(obj):\n    return obj.K, dict(K=1), "K", @@K  # K\n',
    ),
    "f-strings and non-ASCII text on the same line": (
        'def f():\n    s = "é→ü"; return f"{@@K}{s}é{@@helper()!r}"\n',
    ),
    "local imports, except and match bind locally": (
        "def f(v):\n"
        "    import helper\n"
        "    try:\n"
        "        pass\n"
        "    except Exception as K:\n"
        "        pass\n"
        "    match v:\n"
        "        case [SparseMLA, *rest]:\n"
        "            return SparseMLA, rest, helper\n",
    ),
    "decorators, comments and blank lines are kept": (
        "@functools.lru_cache(maxsize=None)  # cached\n"
        "# between the decorators\n"
        "@torch.no_grad()\n"
        "def f(x):\n"
        "\n"
        "    # an inner comment mentioning K\n"
        "    return @@K  # trailing\n"
        "\n"
        "\n"
        "    # after the last statement: outside the function's ast span\n",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_only_module_global_reads_become_live(case: str) -> None:
    (template,) = CASES[case]
    upstream = template.replace("@@", "")
    vendored = vendor(upstream)
    assert function_text(vendored) == template.replace("@@", "_live_target().")
    assert vendored.segment == upstream


@pytest.mark.parametrize("case", list(CASES))
def test_reads_agree_with_the_compilers_symbol_table(case: str) -> None:
    (template,) = CASES[case]
    upstream = template.replace("@@", "")
    vendored = vendor(upstream)
    source = MODULE + upstream + _TAIL
    repeated = {"functools", "torch", "Optional"}
    module_names = {"get_pg_size", "SparseMLA", "K", "len", "helper", "later", "f"}
    want = {
        name
        for name in symtable_globals(source, "f")
        if name not in repeated and (name in module_names or not hasattr(builtins, name))
    }
    assert set(vendored.reads) == want


def test_only_the_imports_the_function_uses_are_repeated() -> None:
    text = vendor("def f(x: torch.Tensor) -> Optional[int]:\n    return None\n").text
    assert "\nimport sys\nimport torch\nfrom typing import Optional\n\n" in text
    assert "functools" not in text and "from megatron" not in text


def test_annotations_that_name_module_globals_are_never_evaluated() -> None:
    vendored = vendor("def f(kernel: SparseMLA, k: K = 1) -> helper:\n    return kernel\n")
    assert "\nfrom __future__ import annotations\n" in vendored.text
    assert "def f(kernel: SparseMLA, k: K = 1) -> helper:\n" in vendored.text
    namespace: dict[str, object] = {}
    exec(compile(vendored.text, "v.py", "exec"), namespace)  # no target module needed


def test_upstreams_future_imports_are_kept() -> None:
    module = "from __future__ import annotations\n" + MODULE
    vendored = vendor("def f() -> K:\n    return 1\n", module=module)
    assert "\nfrom __future__ import annotations\n" in vendored.text


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("@helper\ndef f():\n    pass\n", "reads helper from its module when it is defined"),
        ("def f(x=K):\n    return x\n", "reads K from its module when it is defined"),
        ("def f():\n    global K\n    K = 2\n", "assigns the module global 'K'"),
        ("def f():\n    global K\n    del K\n", "assigns the module global 'K'"),
        ("def f(_live_target):\n    pass\n", "uses the name '_live_target'"),
        ("def f():\n    __reads__ = 1\n", "uses the name '__reads__'"),
    ],
)
def test_functions_that_cannot_be_vendored(function: str, says: str) -> None:
    with pytest.raises(RewriteError, match=says):
        vendor(function)


@pytest.mark.parametrize(
    ("function", "says"),
    [
        ("async def f():\n    pass\n", "is an async function"),
        ("class f:\n    pass\n", "is a class, not a function"),
        ("f = helper\n", "is bound by an ast.Assign statement"),
        ("if K:\n    def f():\n        pass\n", "is bound by an ast.If statement"),
        ("def g():\n    pass\n", "defines no top-level 'f'"),
        ("from elsewhere import f\n", "defines no top-level 'f'"),
    ],
)
def test_symbols_that_are_not_a_top_level_def(function: str, says: str) -> None:
    with pytest.raises(SourceError, match=says):
        vendor(function)


def test_the_last_definition_wins() -> None:
    vendored = vendor("def f():\n    return 1\n\n\ndef f():\n    return @@K\n".replace("@@", ""))
    assert function_text(vendored) == "def f():\n    return _live_target().K\n"


def test_the_vendored_module_text() -> None:
    vendored = vendor("def f():\n    return K + helper()\n")
    assert vendored.reads == ("K", "helper")
    assert '__target_module__ = "m"\n' in vendored.text
    assert '__reads__ = (\n    "K",\n    "helper",\n)\n' in vendored.text
    assert vendored.text.startswith("# Vendored for megatron-backports; see UPSTREAM.toml")
    assert "# ruff: noqa\n" in vendored.text
    assert vendored.segment == "def f():\n    return K + helper()\n"


def test_the_vendored_file_is_written_out_line_for_line() -> None:
    """A re-sync of the same commit must give the same bytes (UPSTREAM.toml pins their
    hash): the whole file, written out here by hand, may not drift."""
    text = vendor("def f():\n    return K\n").text
    assert text.splitlines() == [
        "# Vendored for megatron-backports; see UPSTREAM.toml beside this file.",
        "# repo:   https://example.com/up.git",
        "# pr:     1",
        "# sha:    " + "ab" * 20,
        "# path:   m.py",
        "# symbol: f",
        "# origin: synced by backports sync: upstream's code as it is, except that the module",
        "#         globals it reads are looked up on the live upstream modules.",
        "# Upstream code is not held to this repository's lint rules:",
        "# ruff: noqa",
        '"""Upstream ``f`` at abababababab, synced by backports sync.',
        "",
        "Do not edit by hand: ``backports sync --check`` fails on any change. The names in",
        "``__reads__`` are read from the live target module at call time (those in",
        "``__reads_from__`` from the other modules named there).",
        '"""',
        "",
        "import sys",
        "",
        "# The module whose globals the code reads. The applier rebinds it to the module",
        "# that really defines the first target.",
        '__target_module__ = "m"',
        "",
        "# Module globals of the target that the code reads at call time.",
        "__reads__ = (",
        '    "K",',
        ")",
        "",
        "",
        "def _live_target():",
        "    return sys.modules[__target_module__]",
        "",
        "",
        "def f():",
        "    return _live_target().K",
    ]


def test_the_header_says_only_what_the_entrys_manifest_records():
    """No entry's story in the generic text: a planned move is mentioned only when this
    entry's UPSTREAM.toml records one, and then with its own path."""
    plain = vendor("def f():\n    return K\n")
    assert "plans to move" not in plain.text and "megatron/core/ops" not in plain.text
    provenance = Provenance(
        "https://example.com/up.git", 1, "ab" * 20, "m.py", "f", "m", moved_path="new/m.py"
    )
    moved = one_piece(MODULE + "def f():\n    return K\n" + _TAIL, "f", provenance)
    assert "(upstream plans to move it to new/m.py)" in moved.text


@pytest.mark.parametrize(
    "field, value",
    [
        ("repo", "https://x/r.git\nimport os"),  # a newline ends the header comment
        ("repo", 'https://x/r.git"""; import os; """'),  # quotes end the docstring
        ("path", "m.py\\"),  # a backslash escapes what follows it
        ("path", "m{0}.py"),  # a format field
        ("moved_path", "new/m.py\rimport os"),
        ("sha", "ab" * 20 + "\n"),
    ],
)
def test_a_value_that_would_escape_into_code_is_refused(field: str, value: str) -> None:
    values = {"repo": "https://example.com/up.git", "path": "m.py", "sha": "ab" * 20}
    values["moved_path"] = "new/m.py"
    values[field] = value
    with pytest.raises(RewriteError, match=f"^{field} .* refusing to write it into code"):
        Provenance(values["repo"], 1, values["sha"], values["path"], "f", "m", values["moved_path"])


def test_a_target_module_that_is_no_python_name_is_refused() -> None:
    with pytest.raises(RewriteError, match="is not a dotted Python name"):
        Provenance("https://example.com/up.git", 1, "ab" * 20, "m.py", "f", 'm"\nimport os')


def test_one_piece_and_several_pieces_open_with_the_same_words() -> None:
    """One header wording, whatever the shape: those lines, written out here by hand, may
    not drift (a one-function file is a one-piece file)."""
    provenance = Provenance("https://example.com/up.git", 1, "ab" * 20, "m.py", "f", "m")
    sources = {"m.py": MODULE + "def f():\n    return K\n", "n.py": "def g():\n    return 2\n"}
    pieces = [Piece("m.py", "m", "f"), Piece("n.py", "n", "g")]
    several = render(sources, pieces, provenance).text.splitlines()[6:16]
    one = render(sources, pieces[:1], provenance).text.splitlines()[6:16]
    assert (
        one
        == several
        == [
            "# origin: synced by backports sync: upstream's code as it is, except that the module",
            "#         globals it reads are looked up on the live upstream modules.",
            "# Upstream code is not held to this repository's lint rules:",
            "# ruff: noqa",
            '"""Upstream ``f`` at abababababab, synced by backports sync.',
            "",
            "Do not edit by hand: ``backports sync --check`` fails on any change. The names in",
            "``__reads__`` are read from the live target module at call time (those in",
            "``__reads_from__`` from the other modules named there).",
            '"""',
        ]
    )
