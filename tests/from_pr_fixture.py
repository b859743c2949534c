"""A small upstream-like repository for ``backports new --from-pr``, built with gitpython.

Its files start as the *installed* megatron-core 0.19.2's own (read from site-packages when
a test runs, never stored here); every pull request below is an edit written here, not
upstream's. ``main`` and ``refs/pull/N/head`` are laid out as a GitHub clone has them:

- #101 (merged): ``utils.divide`` raises ValueError for a remainder, with a CPU test
  (route a); its squash commit also sits, cherry-picked, on ``release`` (a twin);
- #90 (main only): ``GeLUFunction.backward`` indexes its saved tensors (drift);
- #102 (merged after #90 and #91, a docs commit): ``GeLUFunction.backward`` clamps its
  gradients (drifted: carried by a three-way merge), with a class-based test (route b);
- #103 (merged): rewrites the line #90 changed: its hunk cannot apply to the installed text;
- #104 (merged): nine new helpers and a class attribute: over the budget;
- #92 (main only): ``ensure_divisibility`` moved to ``megatron/core/divisibility.py``;
- #107 (merged): changes it there (installed: moved, identical);
- #105 (open): changes ``divide`` on a branch never merged;
- #106 (open): one change of every shape (jit_fuser'd function, autograd.Function forward,
  constructor, class body, module statement, new helper, Triton kernel, comment) and an
  added and a changed test;
- #94 (main only) adds ``_BUFFER_NOTE``; #109 (merged) makes ``GlobalMemoryBuffer``'s
  constructor read it: the installed module lacks it;
- #110 (merged): ``LayerWiseDistributedOptimizer.__init__`` (calls ``super()``) sets an
  attribute;
- #111 (merged): changes a function in ``megatron/post_training`` (not shipped in
  megatron-core);
- #95 (main only) renames ``_kernel_make_viewless_tensor`` and adds ``_buffer_size``;
  #112 (merged) changes both: one renamed (found by its body), one absent;
- #113 (merged): the jit_fuser'd ``bias_gelu_back`` calls a new helper (carried along);
- #114 (merged): ``WrappedTensor.__init__`` reads ``DTensor``, bound only in a ``try``;
- #115 (merged): changes ``accepts_parameter`` and a data file (``megatron/core/limits.json``),
  which a function swap cannot carry;
- #116 (merged by an octopus merge titled ``(#116)``): its head changes ``divide``; the
  merge also brings a branch of no pull request that changes ``GeLUFunction.backward``;
- #117 (merged): ``MCoreTensorAwareStateDict._validate_params`` also accepts
  ``"fully_parallel_async"``, its rule rewritten from ``!=``/``and`` to ``not in``: the
  naive sniff judges that spelling (stand-ins answer ``!=`` apart from ``in``);
- #118 (merged): ``scaled_init_method_normal`` gives the plain init for zero layers, with a
  CPU test that raises ``ZeroDivisionError`` inside it on the installed code (route a);
- #121 (merged): a one-line fix of ``round_up_to_nearest_multiple`` (float rounding), with a
  CPU test, beside inert noise: the module docstring, another function's docstring, a comment,
  a bare annotation in a plain class;
- #122 (merged): ``_ValueWithRank.__str__`` calls a method the pull request adds, which reads
  a class attribute it adds, with a CPU test;
- #123 (merged): ``is_submodule`` reads a new module constant and a name it newly imports
  from a module the installed release has;
- #124 (merged): two ``__init__``s in two modules (``GlobalMemoryBuffer``'s and
  ``LayerWiseDistributedOptimizer``'s) each set one more attribute;
- #125 (merged): ``get_model_config`` counts its calls in a module counter it adds, through
  a new helper that assigns it (``global``);
- #126 (merged): deletes the module function ``get_model_xattn`` beside a one-line fix of
  ``get_model_type``;
- #127 (merged): adds a backend to the module constant ``_VALID_DSA_KERNEL_BACKENDS`` and
  rewords the function that reads it;
- #128 (merged): ``_reduce`` (tensor parallel) all-reduces a float32 copy and casts it back:
  seen only in what it hands ``torch.distributed.all_reduce`` and what it returns.
- #129 (merged): ``VocabUtility.vocab_range_from_per_partition_vocab_size`` refuses a rank
  outside the world; its test is a parametrized method of a plain test class that reaches
  the static method through a module alias and a module-level helper;
- #130 (merged): the property ``MCoreTensorAwareStateDict.tensors`` raises RuntimeError where
  it asserted, with a module-level CPU test (route a on a property).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import git

UTILS = "megatron/core/utils.py"
GELU = "megatron/core/fusions/fused_bias_gelu.py"
ROPE = "megatron/core/fusions/fused_mla_yarn_rope_apply.py"
LAYERWISE = "megatron/core/optimizer/layer_wise_optimizer.py"
DIVISIBILITY = "megatron/core/divisibility.py"
POST_TRAINING = "megatron/post_training/notes.py"
TEST_UTILS = "tests/unit_tests/test_utils.py"
TEST_GELU = "tests/unit_tests/fusions/test_fused_bias_gelu.py"
TASD = "megatron/core/dist_checkpointing/tensor_aware_state_dict.py"
TEST_TASD = "tests/unit_tests/dist_checkpointing/test_tensor_aware_state_dict.py"
MAPPINGS = "megatron/core/tensor_parallel/mappings.py"
NEWEST = 130
LIMITS = "megatron/core/limits.json"
TP_UTILS = "megatron/core/tensor_parallel/utils.py"
TEST_VOCAB = "tests/unit_tests/tensor_parallel/test_vocab_range.py"

DIVIDE = '''\
def divide(numerator, denominator):
    """Ensure that numerator is divisible by the denominator and return
    the division value."""
    ensure_divisibility(numerator, denominator)
    return numerator // denominator
'''
DIVIDE_FIXED = '''\
def divide(numerator, denominator):
    """Ensure that numerator is divisible by the denominator and return
    the division value."""
    if denominator == 0 or numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator
'''
TEST_UTILS_TEXT = """\
from megatron.core.utils import divide


def test_divide_whole_numbers():
    assert divide(6, 3) == 2
"""
TEST_UTILS_101 = (
    TEST_UTILS_TEXT
    + """

def test_divide_refuses_a_remainder_with_value_error():
    import pytest

    with pytest.raises(ValueError):
        divide(7, 2)
"""
)
TEST_GELU_TEXT = """\
import torch

from megatron.core.fusions.fused_bias_gelu import GeLUFunction


class TestGeLUFunction:
    def setup_method(self, method):
        torch.manual_seed(0)

    def test_forward_shape(self):
        x = torch.ones(2, 3)
        assert GeLUFunction.apply(x, torch.zeros(3)).shape == x.shape
"""
TEST_GELU_102 = (
    TEST_GELU_TEXT
    + """
    def test_backward_clamps_the_gradient(self):
        x = torch.ones(2, 3, requires_grad=True)
        GeLUFunction.apply(x, torch.zeros(3)).sum().mul(100).backward()
        assert torch.equal(x.grad, torch.clamp(x.grad, -1.0, 1.0))
"""
)
POST_TRAINING_TEXT = '''\
def describe(model):
    """What this model is, in a word."""
    return type(model).__name__
'''


def installed_text(path: str) -> str:
    """The installed megatron-core 0.19.2's file at ``path`` (read, never imported)."""
    dist = importlib.metadata.distribution("megatron-core")
    return Path(str(dist.locate_file(path))).read_text(encoding="utf-8")


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"the fixture's edit no longer applies: {old[:60]!r}"
    return text.replace(old, new)


@dataclass
class Upstream:
    path: Path
    repo: git.Repo
    commits: dict[str, str] = field(default_factory=dict)  # name -> sha

    def sha(self, name: str) -> str:
        return self.commits[name]


class _Builder:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.repo = git.Repo.init(root, initial_branch="main")
        self.tick = 0
        self.files: dict[str, dict[str, str]] = {}  # commit sha -> the tree's texts

    def commit(self, parent: str | None, files: dict[str, str], message: str) -> str:
        """A commit with exactly ``files`` (path -> text) as its tree."""
        git_cmd = self.repo.git
        if parent is not None:
            git_cmd.checkout("--quiet", "--force", "--detach", parent)
        for tracked in git_cmd.ls_files().splitlines():
            if tracked not in files:
                git_cmd.rm("--quiet", "--cached", tracked)
                (self.root / tracked).unlink()
        for path, text in files.items():
            target = self.root / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            git_cmd.add(path)
        with git_cmd.custom_environment(**self.identity()):
            git_cmd.commit("--quiet", "--allow-empty", "-m", message)
        sha = self.repo.head.commit.hexsha
        self.files[sha] = dict(files)
        return sha

    def identity(self) -> dict[str, str]:
        """The author, committer and a date one hour after the last commit's."""
        self.tick += 1
        date = f"2026-08-{1 + self.tick // 24:02d}T{self.tick % 24:02d}:00:00+00:00"
        return {
            "GIT_AUTHOR_NAME": "Fixture",
            "GIT_AUTHOR_EMAIL": "fixture@example.com",
            "GIT_COMMITTER_NAME": "Fixture",
            "GIT_COMMITTER_EMAIL": "fixture@example.com",
            "GIT_AUTHOR_DATE": date,
            "GIT_COMMITTER_DATE": date,
        }

    def change(self, parent: str, message: str, **edits: dict[str, str]) -> str:
        files = dict(self.files[parent])
        for path, text in edits.get("files", {}).items():
            files[path] = text
        return self.commit(parent, files, message)

    def ref(self, name: str, sha: str) -> None:
        self.repo.git.update_ref(name, sha)


def _initial() -> dict[str, str]:
    return {
        UTILS: installed_text(UTILS),
        GELU: installed_text(GELU),
        ROPE: installed_text(ROPE),
        LAYERWISE: installed_text(LAYERWISE),
        TASD: installed_text(TASD),
        MAPPINGS: installed_text(MAPPINGS),
        TP_UTILS: installed_text(TP_UTILS),
        POST_TRAINING: POST_TRAINING_TEXT,
        TEST_UTILS: TEST_UTILS_TEXT,
        TEST_GELU: TEST_GELU_TEXT,
        "README.md": "# Megatron-LM (a test fixture)\n",
    }


def _pull(b: _Builder, number: int, base: str, message: str, files: dict[str, str]) -> str:
    """The pull request's head on ``base``, and its squash merge on ``main``'s tip."""
    head = b.change(base, f"wip: {message}", files=files)
    b.ref(f"refs/pull/{number}/head", head)
    return head


def _merge(b: _Builder, main: str, number: int, message: str, head: str) -> str:
    """Squash-merge: main's tip with the files the pull request changed, as its head has
    them (the branch point is the head's parent)."""
    branch_point = b.files[b.repo.commit(head).parents[0].hexsha]
    changed = {path: text for path, text in b.files[head].items() if branch_point.get(path) != text}
    return b.change(main, f"{message} (#{number})", files=changed)


def build(root: Path) -> Upstream:
    """The repository at ``root`` (created); its commits by name."""
    b = _Builder(root)
    c: dict[str, str] = {}
    c["initial"] = main = b.commit(None, _initial(), "Initial import (#1)")
    start = b.files[main]

    # #101: divide raises ValueError; merged; a twin on release.
    c["head101"] = _pull(
        b, 101, main, "divide raises ValueError",
        {UTILS: edit(start[UTILS], DIVIDE, DIVIDE_FIXED), TEST_UTILS: TEST_UTILS_101},
    )  # fmt: skip
    c["merge101"] = main = _merge(b, main, 101, "Refuse a remainder in divide", c["head101"])
    side = b.change(c["initial"], "Release notes", files={"README.md": "# release\n"})
    c["twin101"] = b.change(
        side, "Refuse a remainder in divide (#101)", files={UTILS: b.files[main][UTILS]}
    )
    b.ref("refs/heads/release", c["twin101"])

    # #90: drift inside GeLUFunction.backward (the same values, other code).
    gelu = b.files[main][GELU]
    drifted = edit(
        gelu,
        "        input, bias = ctx.saved_tensors\n",
        "        input, bias = ctx.saved_tensors[0], ctx.saved_tensors[1]\n",
    )
    c["drift90"] = main = b.change(main, "Index GeLU's saved tensors (#90)", files={GELU: drifted})

    # #102: the gradients clamped (a drifted target); a class-based test.
    fixed102 = edit(
        drifted,
        "        return tmp, tmp\n",
        "        tmp = tmp.clamp(-1.0, 1.0)\n        return tmp, tmp\n",
    )
    c["head102"] = _pull(b, 102, main, "clamp", {GELU: fixed102, TEST_GELU: TEST_GELU_102})
    # main moves on before the merge: the squash's parent is not the branch point.
    c["docs91"] = main = b.change(main, "Docs (#91)", files={"README.md": "# Megatron-LM\n"})
    c["merge102"] = main = _merge(b, main, 102, "Clamp GeLU's gradients", c["head102"])

    # #103: rewrites #90's line again: its hunk cannot apply to the installed text.
    conflicting = edit(
        b.files[main][GELU],
        "        input, bias = ctx.saved_tensors[0], ctx.saved_tensors[1]\n",
        "        input, bias = tuple(ctx.saved_tensors)\n",
    )
    c["head103"] = _pull(b, 103, main, "tuple", {GELU: conflicting})
    c["merge103"] = main = _merge(b, main, 103, "Unpack GeLU's saved inputs", c["head103"])

    # #104: too big.
    helpers = "".join(f"\n\ndef _helper_{i}(x):\n    return x + {i}\n" for i in range(9))
    big_utils = b.files[main][UTILS] + helpers
    big_gelu = edit(
        b.files[main][GELU],
        "class GeLUFunction(torch.autograd.Function):\n",
        "class GeLUFunction(torch.autograd.Function):\n    note = 'gelu'\n",
    )
    c["head104"] = _pull(b, 104, main, "many helpers", {UTILS: big_utils, GELU: big_gelu})
    c["merge104"] = main = _merge(b, main, 104, "Add helpers", c["head104"])

    # #92: ensure_divisibility moved to its own module; #107 changes it there.
    utils = b.files[main][UTILS]
    start_at = utils.index("def ensure_divisibility(")
    end_at = utils.index("def divide(")
    moved = utils[start_at:end_at].rstrip() + "\n"
    c["move92"] = main = b.change(
        main,
        "Move ensure_divisibility (#92)",
        files={
            UTILS: utils[:start_at]
            + "from megatron.core.divisibility import ensure_divisibility\n\n\n"
            + utils[end_at:],
            DIVISIBILITY: '"""Divisibility checks."""\n\n\n' + moved,
        },
    )
    changed107 = edit(
        b.files[main][DIVISIBILITY],
        '"{} is not divisible by {}"',
        '"{} is not a multiple of {}"',
    )
    c["head107"] = _pull(b, 107, main, "reword", {DIVISIBILITY: changed107})
    c["merge107"] = main = _merge(b, main, 107, "Reword the divisibility message", c["head107"])

    # #105: open, never merged.
    c["head105"] = _pull(
        b, 105, main, "divide by one",
        {UTILS: edit(b.files[main][UTILS], "    return numerator // denominator\n",
                     "    return int(numerator // denominator)\n")},
    )  # fmt: skip

    # #106: every shape, open.
    g = b.files[main][GELU]
    g = edit(g, "    x = bias + y\n    tanh_out", "    x = y + bias\n    tanh_out")  # jit_fuser'd
    g = edit(
        g,
        "        ctx.save_for_backward(input, bias)\n",
        "        ctx.save_for_backward(input, bias)  # both\n",
    )
    g = edit(
        g,
        "bias_gelu_impl = GeLUFunction.apply\n",
        "bias_gelu_impl = GeLUFunction.apply  # alias\n\n\ndef _gelu_note():\n    return 'tanh'\n",
    )
    g = edit(
        g,
        "# BIAS GELU FUSION/ NO AUTOGRAD ################\n",
        "# BIAS GELU FUSION (NO AUTOGRAD)\n",
    )
    g = edit(g, "    note = 'gelu'\n", "    note = 'gelu, tanh'\n")  # class body
    u = b.files[main][UTILS]
    u = edit(
        u,
        "    def __init__(self):\n        self.buffer = {}\n",
        "    def __init__(self):\n        self.buffer = dict()\n",
    )
    r = b.files[main][ROPE]
    r = edit(
        r,
        "    Triton kernel of the forward pass for applying YARN RoPE to MLA's query.\n",
        "    Triton kernel of the forward pass applying YARN RoPE to MLA's query.\n",
    )
    t = b.files[main][TEST_UTILS].replace("assert divide(6, 3) == 2", "assert divide(8, 4) == 2")
    t += "\n\ndef test_divide_by_one():\n    assert divide(5, 1) == 5\n"
    c["head106"] = _pull(b, 106, main, "shapes", {GELU: g, UTILS: u, ROPE: r, TEST_UTILS: t})

    # #94 and #109: a constructor reads a module global the installed release lacks.
    c["note94"] = main = b.change(
        main, "A note for buffers (#94)",
        files={UTILS: b.files[main][UTILS] + '\n\n_BUFFER_NOTE = "buffers"\n'},
    )  # fmt: skip
    reads = edit(
        b.files[main][UTILS],
        "    def __init__(self):\n        self.buffer = {}\n",
        "    def __init__(self):\n        self.buffer = {}\n        self.note = _BUFFER_NOTE\n",
    )
    c["head109"] = _pull(b, 109, main, "note", {UTILS: reads})
    c["merge109"] = main = _merge(b, main, 109, "Name the note", c["head109"])

    # #110: a constructor that calls super().
    lw = edit(
        b.files[main][LAYERWISE],
        "        super().__init__(optimizers)\n",
        "        self.derived_by_fixture = True\n        super().__init__(optimizers)\n",
    )
    c["head110"] = _pull(b, 110, main, "mark", {LAYERWISE: lw})
    c["merge110"] = main = _merge(b, main, 110, "Mark the optimizer", c["head110"])

    # #111: outside the installed distribution.
    pt = edit(b.files[main][POST_TRAINING], "type(model).__name__", "type(model).__qualname__")
    c["head111"] = _pull(b, 111, main, "qualname", {POST_TRAINING: pt})
    c["merge111"] = main = _merge(b, main, 111, "Describe by qualname", c["head111"])

    # #95 renames a function and adds one; #112 changes both (renamed; absent).
    u = b.files[main][UTILS]
    u = edit(u, "def _kernel_make_viewless_tensor(inp,", "def _make_viewless(inp,")
    u = u.replace("_kernel_make_viewless_tensor(", "_make_viewless(")
    u += "\n\ndef _buffer_size(shape):\n    return len(shape)\n"
    c["rename95"] = main = b.change(main, "Shorter names (#95)", files={UTILS: u})
    u = edit(
        b.files[main][UTILS],
        "    out.data = inp.data\n",
        "    out.data = inp.data  # shares storage\n    out.requires_grad_(requires_grad)\n",
    )
    u = edit(u, "    return len(shape)\n", "    return max(len(shape), 1)\n")
    c["head112"] = _pull(b, 112, main, "viewless", {UTILS: u})
    c["merge112"] = main = _merge(b, main, 112, "Viewless tensors keep requires_grad", c["head112"])

    # #113: a jit_fuser'd function calls a new helper.
    g = edit(
        b.files[main][GELU],
        "@jit_fuser\ndef bias_gelu_back(g, bias, y):\n    x = bias + y\n"
        "    tanh_out = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))\n",
        "def _tanh_out(x):\n    return torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))\n\n\n"
        "@jit_fuser\ndef bias_gelu_back(g, bias, y):\n"
        "    x = bias + y\n    tanh_out = _tanh_out(x)\n",
    )
    c["head113"] = _pull(b, 113, main, "helper", {GELU: g})
    c["merge113"] = main = _merge(b, main, 113, "A helper for tanh", c["head113"])

    # #114: a constructor reads names its module binds only where an import succeeds.
    u = edit(
        b.files[main][UTILS],
        "    def __init__(self, tensor: torch.Tensor):\n        self._wrapper = [tensor]\n",
        "    def __init__(self, tensor: torch.Tensor):\n        self._wrapper = [tensor]\n"
        "        self._distributed = HAVE_DTENSOR and isinstance(tensor, DTensor)\n",
    )
    c["head114"] = _pull(b, 114, main, "dtensor", {UTILS: u})
    c["merge114"] = main = _merge(b, main, 114, "Note distributed tensors", c["head114"])

    # #115: a change to a non-Python file under megatron/ beside its Python change.
    u = edit(
        b.files[main][UTILS],
        "p.name == name or p.kind == inspect.Parameter.VAR_KEYWORD for p in params",
        "p.name == name for p in params",
    )
    c["head115"] = _pull(b, 115, main, "limits", {UTILS: u, LIMITS: '{"divide": 1}\n'})
    c["merge115"] = main = _merge(b, main, 115, "Divide within limits", c["head115"])

    # #116: an octopus merge titled (#116) brings #116's head and a branch of its own.
    u = edit(b.files[main][UTILS], "    return numerator // denominator\n",
             "    return numerator // denominator  # whole\n")  # fmt: skip
    c["head116"] = _pull(b, 116, main, "comment", {UTILS: u})
    g = edit(b.files[main][GELU], "        return tmp, tmp\n", "        return tmp, tmp  # both\n")
    c["other116"] = b.change(main, "Another change", files={GELU: g})
    both = b.change(main, "both", files={UTILS: u, GELU: g})
    tree = b.repo.commit(both).tree.hexsha
    parents = [main, c["head116"], c["other116"]]
    with b.repo.git.custom_environment(**b.identity()):
        flags = [arg for parent in parents for arg in ("-p", parent)]
        octopus = b.repo.git.commit_tree(tree, *flags, "-m", "Merge branches (#116)").strip()
    b.files[octopus] = b.files[both]
    c["merge116"] = main = octopus

    # #117: one more accepted algorithm, the rule spelled another way.
    tasd = edit(
        b.files[main][TASD],
        '        if algo != "atomic" and algo != "fully_parallel":\n',
        '        if algo not in ("atomic", "fully_parallel", "fully_parallel_async"):\n',
    )
    c["head117"] = _pull(b, 117, main, "async", {TASD: tasd})
    c["merge117"] = main = _merge(b, main, 117, "Accept fully_parallel_async", c["head117"])

    # #118: zero layers raise inside the installed function; its test says so.
    u = edit(
        b.files[main][UTILS],
        "    std = sigma / math.sqrt(multiplier * num_layers)\n",
        "    if num_layers == 0:\n        return init_method_normal(sigma)\n"
        "    std = sigma / math.sqrt(multiplier * num_layers)\n",
    )
    t = "from megatron.core.utils import scaled_init_method_normal\n" + b.files[main][TEST_UTILS]
    t += (
        "\n\ndef test_zero_layers_keep_the_plain_init():\n"
        "    assert scaled_init_method_normal(0.02, 0).keywords['std'] == 0.02\n"
    )
    c["head118"] = _pull(b, 118, main, "zero layers", {UTILS: u, TEST_UTILS: t})
    c["merge118"] = main = _merge(b, main, 118, "Plain init for zero layers", c["head118"])

    main = _shapes(b, c, main)
    main = _property(b, c, main)
    b.ref("refs/heads/main", main)
    b.repo.git.checkout("--quiet", "--force", "main")
    return Upstream(root, b.repo, c)


ROUND_UP = "    return math.ceil(value / multiple) * multiple\n"
ROUND_UP_FIXED = "    return -(-value // multiple) * multiple\n"
TEST_ROUND_UP = """

def test_round_up_keeps_big_integers_exact():
    from megatron.core.utils import round_up_to_nearest_multiple

    assert round_up_to_nearest_multiple(2**53 + 1, 1) == 2**53 + 1
"""
SHOWN_VALUE = (
    "    def _shown_value(self) -> str:\n"
    "        if self._unit in self._PLAIN_UNITS:\n"
    "            return str(self._value)\n"
    '        return f"{self._value:.2f}"\n\n'
)
TEST_SHOWN_VALUE = """

def test_a_value_without_a_unit_is_shown_as_it_is():
    from megatron.core.utils import _ValueWithRank

    assert str(_ValueWithRank(3, 0)) == "3/0"
"""


COUNTER = """\
_CONFIG_READS = 0


def _count_config_read():
    global _CONFIG_READS
    _CONFIG_READS += 1
    return _CONFIG_READS


"""


def _shapes(b: _Builder, c: dict[str, str], main: str) -> str:
    """#121-#123: the shapes small fixes have (inert noise, a new method and class
    attribute, a new constant and import); main's new tip."""
    u = b.files[main][UTILS]
    u = edit(u, ROUND_UP, ROUND_UP_FIXED)
    u = edit(u, '"""Utility functions used throughout Megatron core"""',
             '"""Utility functions used throughout Megatron core."""')  # fmt: skip
    u = edit(u, "    Check if a module is a submodule of another module.\n",
             "    Whether a module is a submodule of another module.\n")  # fmt: skip
    u = edit(u, "def get_model_type(model):\n",
             "def get_model_type(model):\n    # The model's type, wrapped or not.\n")  # fmt: skip
    u = edit(u, "    def __init__(self):\n        self.buffer = {}\n",
             "    buffer: dict\n\n    def __init__(self):\n        self.buffer = {}\n")  # fmt: skip
    t = b.files[main][TEST_UTILS] + TEST_ROUND_UP
    c["head121"] = _pull(b, 121, main, "round up", {UTILS: u, TEST_UTILS: t})
    c["merge121"] = main = _merge(b, main, 121, "Round up big integers exactly", c["head121"])

    u = b.files[main][UTILS]
    u = edit(u, '        return f"{self._value:.2f}{self._unit}/{self._rank}"\n',
             '        return f"{self._shown_value()}{self._unit}/{self._rank}"\n')  # fmt: skip
    u = edit(u, "    def __str__(self) -> str:\n", SHOWN_VALUE + "    def __str__(self) -> str:\n")
    docstring_end = '        _unit (str) : unit for the value\n    """\n'
    u = edit(u, docstring_end, docstring_end + '\n    _PLAIN_UNITS = ("",)\n')
    t = b.files[main][TEST_UTILS] + TEST_SHOWN_VALUE
    c["head122"] = _pull(b, 122, main, "plain values", {UTILS: u, TEST_UTILS: t})
    c["merge122"] = main = _merge(b, main, 122, "Show a value without unit plainly", c["head122"])

    u = b.files[main][UTILS]
    u = edit(u, "import array\n", "import array\nfrom functools import partial as _partial\n")
    u = edit(u, "def is_submodule(module, parent_module, strict=True):\n",
             "_STRICT_DEFAULT = True\n\n\n"
             "def is_submodule(module, parent_module, strict=None):\n")  # fmt: skip
    u = edit(u, "    if strict:\n        if module is parent_module:",
             "    if _partial(bool, _STRICT_DEFAULT if strict is None else strict)():\n"
             "        if module is parent_module:")  # fmt: skip
    c["head123"] = _pull(b, 123, main, "strict default", {UTILS: u})
    c["merge123"] = main = _merge(b, main, 123, "A default for is_submodule", c["head123"])

    init = "    def __init__(self):\n"
    u = edit(b.files[main][UTILS], f"{init}        self.buffer = {{}}\n",
             f"{init}        self.hits = 0\n        self.buffer = {{}}\n")  # fmt: skip
    lw = edit(b.files[main][LAYERWISE], "        super().__init__(optimizers)\n",
              "        super().__init__(optimizers)\n        self.hits = 0\n")  # fmt: skip
    c["head124"] = _pull(b, 124, main, "hits", {UTILS: u, LAYERWISE: lw})
    c["merge124"] = main = _merge(b, main, 124, "Count hits", c["head124"])

    u = edit(
        b.files[main][UTILS],
        "def get_model_config(model):\n",
        COUNTER + "def get_model_config(model):\n",
    )
    u = edit(u, '    return get_attr_wrapped_model(model, "config", allow_none=False)\n',
             '    _count_config_read()\n'
             '    return get_attr_wrapped_model(model, "config", allow_none=False)\n')  # fmt: skip
    c["head125"] = _pull(b, 125, main, "count", {UTILS: u})
    c["merge125"] = main = _merge(b, main, 125, "Count config reads", c["head125"])

    u = b.files[main][UTILS]
    start_at = u.index("def get_model_xattn(model):")
    u = u[:start_at] + u[u.index("_CONFIG_READS = 0", start_at) :]
    model_type = '    return get_attr_wrapped_model(model, "model_type"'
    u = edit(u, f"{model_type})\n", f"{model_type}, return_model_obj=False)\n")
    c["head126"] = _pull(b, 126, main, "no xattn", {UTILS: u})
    c["merge126"] = main = _merge(b, main, 126, "Drop get_model_xattn", c["head126"])

    backends = '_VALID_DSA_KERNEL_BACKENDS = ("none", "tilelang", "cudnn"'
    u = edit(b.files[main][UTILS], f"{backends})\n", f'{backends}, "flashmla")\n')
    u = edit(u, '"dsa_kernel_backend must be one of: "', '"dsa_kernel_backend must be one of "')
    c["head127"] = _pull(b, 127, main, "flashmla", {UTILS: u})
    c["merge127"] = main = _merge(b, main, 127, "Accept the flashmla backend", c["head127"])

    m = edit(
        b.files[main][MAPPINGS],
        "    input_ = input_.contiguous()\n    torch.distributed.all_reduce(input_, group=group)\n",
        "    reduced = input_.float().contiguous()\n"
        "    torch.distributed.all_reduce(reduced, group=group)\n"
        "    input_ = reduced.to(input_.dtype)\n",
    )
    c["head128"] = _pull(b, 128, main, "fp32 reduce", {MAPPINGS: m})
    c["merge128"] = main = _merge(b, main, 128, "All-reduce in float32", c["head128"])

    vocab = edit(
        b.files[main][TP_UTILS],
        "        index_f = rank * per_partition_vocab_size\n",
        "        if not 0 <= rank < world_size:\n"
        '            raise ValueError(f"rank {rank} is outside a world of {world_size}")\n'
        "        index_f = rank * per_partition_vocab_size\n",
    )
    files = {TP_UTILS: vocab, TEST_VOCAB: TEST_VOCAB_TEXT}
    c["head129"] = _pull(b, 129, main, "rank range", files)
    c["merge129"] = main = _merge(b, main, 129, "Refuse a rank outside the world", c["head129"])
    return main


# #129's test: a method of a plain class, parametrized, reaching the target only through a
# module alias inside a module-level helper (no name of the test is the target's).
TEST_VOCAB_TEXT = """\
import pytest

import megatron.core.tensor_parallel.utils as tp_utils


def _vocab_range(rank, world_size):
    return tp_utils.VocabUtility.vocab_range_from_per_partition_vocab_size(8, rank, world_size)


class TestVocabRange:
    def test_a_rank_in_the_world_gets_its_slice(self):
        assert tuple(_vocab_range(1, 2)) == (8, 16)

    @pytest.mark.parametrize("rank", [2, -1])
    def test_a_rank_outside_the_world_is_refused(self, rank):
        with pytest.raises(ValueError):
            _vocab_range(rank, 2)
"""


TENSORS_DOC = '        Get the tensor data from the state dict.\n        """\n'
HOLLOW_ASSERT = TENSORS_DOC + "        assert not self.is_hollow  # TODO raise exception\n"
HOLLOW_RAISES = TENSORS_DOC + (
    "        if self.is_hollow:\n"
    '            raise RuntimeError("the tensors were taken out: insert them back first")\n'
)
TEST_HOLLOW = """\
import pytest

from megatron.core.dist_checkpointing.tensor_aware_state_dict import MCoreTensorAwareStateDict


def test_the_tensors_of_a_hollow_state_dict_raise_runtime_error():
    hollow = MCoreTensorAwareStateDict(common={}, sharded_state_dict={}, _is_hollow=True)
    with pytest.raises(RuntimeError, match="insert them back"):
        hollow.tensors
"""


def _property(b: _Builder, c: dict[str, str], main: str) -> str:
    """#130: a property's getter changed, with a module-level CPU test; main's new tip."""
    tasd = edit(b.files[main][TASD], HOLLOW_ASSERT, HOLLOW_RAISES)
    c["head130"] = _pull(b, 130, main, "hollow", {TASD: tasd, TEST_TASD: TEST_HOLLOW})
    c["merge130"] = main = _merge(b, main, 130, "Raise for a hollow state dict", c["head130"])
    return main


_BUILT: dict[str, Upstream] = {}


def shared(tmp_path_factory: Any) -> Upstream:
    """One repository per test session (building it takes seconds), under pytest's
    temporary folder; a test that changes it puts it back."""
    key = str(tmp_path_factory.getbasetemp())
    if key not in _BUILT:
        _BUILT[key] = build(tmp_path_factory.mktemp("from-pr") / "Megatron-LM")
    return _BUILT[key]
