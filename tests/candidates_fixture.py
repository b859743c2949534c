"""A small upstream-like repository for ``backports candidates``, built with gitpython
(``tests/from_pr_fixture.py``'s builder). Its files are the *installed* megatron-core
0.19.2's own, read from site-packages when a test runs; every merge below is an edit
written here, not upstream's.

- ``main``: #1, #2 before the branch point; the release branch ``core_r0.19.0`` leaves
  main at #2 (no ``core_v0.19.2`` tag: the branch gives the point). At the branch point
  ``divide`` lacks the installed release's ``ensure_divisibility`` call;
- #201 (fix): puts the call back; cherry-picked onto ``core_r0.19.0`` by #210, so the
  installed text is the merge's: **already present**;
- #202 (fix, NaN): ``GeLUFunction.backward`` clamps its gradient, with a test: **missing**;
- #203 (refactor): renames a local of ``bias_gelu``: **missing**, not a fix;
- #204 then #205 (fix, leak): ``GlobalMemoryBuffer.__init__`` changed twice: the installed
  text is neither #205's parent nor #205: **drifted**;
- #6099 (the builtin ``megatron-lm-6099``'s number): ``count_zeros`` passes a group:
  **carried by a builtin**;
- #206: changes ``examples/`` only: left out;
- #207 (fix, crash): a file under ``megatron/core/inference/``: not reachable.
"""

from __future__ import annotations

from pathlib import Path

from tests.from_pr_fixture import (
    DIVIDE,
    GELU,
    LAYERWISE,
    TEST_GELU,
    TEST_GELU_TEXT,
    TEST_UTILS,
    TEST_UTILS_TEXT,
    UTILS,
    Upstream,
    _Builder,
    edit,
    installed_text,
)

DIVIDE_BEFORE = DIVIDE.replace("    ensure_divisibility(numerator, denominator)\n", "")
EXAMPLE = "examples/run_simple.py"
ENGINE = "megatron/core/inference/engines/tiny_engine.py"
BUFFER_INIT = "    def __init__(self):\n        self.buffer = {}\n"


def _initial() -> dict[str, str]:
    return {
        UTILS: edit(installed_text(UTILS), DIVIDE, DIVIDE_BEFORE),
        GELU: installed_text(GELU),
        LAYERWISE: installed_text(LAYERWISE),
        TEST_UTILS: TEST_UTILS_TEXT,
        TEST_GELU: TEST_GELU_TEXT,
        EXAMPLE: "print('hello')\n",
        "README.md": "# Megatron-LM (a test fixture)\n",
    }


def build(root: Path) -> Upstream:
    """The repository at ``root`` (created); its commits by name."""
    b = _Builder(root)
    c: dict[str, str] = {}
    c["initial"] = main = b.commit(None, _initial(), "Initial import (#1)")
    c["point"] = main = b.change(main, "Docs (#2)", files={"README.md": "# Megatron-LM\n"})

    def merge(name: str, message: str, files: dict[str, str]) -> None:
        nonlocal main
        c[name] = main = b.change(main, message, files=files)

    fixed_utils = edit(b.files[main][UTILS], DIVIDE_BEFORE, DIVIDE)
    merge("present", "fix: divide checks divisibility again (#201)", {UTILS: fixed_utils})
    c["cherry_pick"] = b.change(
        c["point"],
        "cp: `fix: divide checks divisibility again (201)` into `core_r0.19.0` (#210)",
        files={UTILS: fixed_utils},
    )
    b.ref("refs/heads/core_r0.19.0", c["cherry_pick"])

    gelu = b.files[main][GELU]
    clamped = edit(
        gelu,
        "        return tmp, tmp\n",
        "        tmp = torch.nan_to_num(tmp)\n        return tmp, tmp\n",
    )
    test = TEST_GELU_TEXT + "\n    def test_backward_has_no_nan(self):\n        pass\n"
    merge(
        "missing",
        "fix: GeLU's backward returns NaN for large inputs (#202)",
        {GELU: clamped, TEST_GELU: test},
    )
    renamed = edit(
        b.files[main][GELU],
        "def bias_gelu(bias, y):\n    x = bias + y\n    return x * 0.5",
        "def bias_gelu(bias, y):\n    z = bias + y\n    return z * 0.5",
    ).replace("(1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))",
              "(1.0 + torch.tanh(0.79788456 * z * (1 + 0.044715 * z * z)))", 1)  # fmt: skip
    merge("refactor", "refactor: rename a local of bias_gelu (#203)", {GELU: renamed})

    tidy = edit(
        b.files[main][UTILS], BUFFER_INIT, "    def __init__(self):\n        self.buffer = dict()\n"
    )
    merge("drift", "Tidy the buffer constructor (#204)", {UTILS: tidy})
    leak = edit(
        tidy,
        "        self.buffer = dict()\n",
        "        self.buffer = dict()\n        self.released = []\n",
    )
    merge("drifted", "fix: GlobalMemoryBuffer leaks memory on reset (#205)", {UTILS: leak})

    grouped = edit(
        b.files[main][LAYERWISE],
        "            grad_stats_parallel_group=None,\n            use_decoupled_grad",
        "            grad_stats_parallel_group=self.tp_group,\n            use_decoupled_grad",
    )
    merge("carried", "Fix gradient counting for muon+expert biases (#6099)", {LAYERWISE: grouped})
    merge("examples", "fix: the example crashes (#206)", {EXAMPLE: "print('fixed')\n"})
    engine = "def step(engine):\n    return engine.run()\n"
    merge("inference", "fix: the engine crashes on an empty batch (#207)", {ENGINE: engine})
    c["main"] = main
    b.ref("refs/heads/main", main)
    b.repo.git.checkout("--quiet", "--force", "main")
    return Upstream(root, b.repo, c)
