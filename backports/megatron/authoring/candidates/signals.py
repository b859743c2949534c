"""Step three: how much a merge looks like a fix, and whether a training job runs its code.

Fix-likeness is a score from the merge's own words and files (``FIX_LIKE`` and up: a fix):

- +3 the subject says fix (``fix:``, ``fix(moe):``, "Fix ...", "bug", "hotfix");
- +2 it names a symptom strongly: silent numerics (NaN, inf, wrong, incorrect, corrupt,
  mismatch, silently, overflow, under-update), a crash (crash, segfault, illegal memory
  access, hang, deadlock) or memory (OOM, out of memory, leak); else +1 weakly: precision,
  dtype, loss, gradient, norm (numerics); exception, error, fail, timeout (crash); memory,
  allocation, free (memory). The first found, in that order, is the category;
- +1 it adds or changes a test (a file under ``tests/``);
- +1 it links an issue (``#1234`` other than its own number, "Fixes", "Closes");
- -3 the subject says refactor, rename, move, clean up, remove unused, simplify, or starts
  with ``chore``, ``ci``, ``docs``, ``build``, ``style``, ``test``, ``perf``;
- -1 it adds a feature (the subject starts with add, support, enable, introduce, ``feat``).

Reachability is by path, per touched ``megatron/`` file: ``experimental`` (a folder named
``experimental``), ``inference`` (a folder named ``inference`` or ``text_generation_server``,
or ``inference`` in the file's name), another entry point (``megatron/core/export``,
``megatron/core/post_training``, ``megatron/post_training``, ``megatron/rl``,
``megatron/inference``, ``megatron/elastification``), else ``training`` (the rest of
``megatron/core`` and ``megatron/training``, which a training job imports). A merge is
reachable when one of its touched files is.
"""

import re

from .model import FixSignal, Merge, Reach

_FIX = re.compile(r"\b(?:fix(?:es|ed)?|bugs?|bugfix|hotfix)\b", re.I)
# (category, its strong words, its weak words): every strong word is tried before any weak.
_SEVERITY = (
    (
        "numerics",
        r"\bnan\b|\binf\b|\bwrong\b|\bincorrect(?:ly)?\b|\bcorrupt\w*|\bmismatch\w*"
        r"|\bsilent(?:ly)?\b|\boverflow\w*|\bunderflow\w*|\b(?:under|over)-?updat\w*",
        r"\bprecision\b|\bdtype\b|\bfp32\b|\bloss\b|\bgrad(?:ient)?s?\b|\bnorm\b"
        r"|\bdivergen\w*",
    ),
    (
        "crash",
        r"\bcrash\w*|\bsegfault\w*|illegal memory|\bhangs?\b|\bhanging\b|\bdeadlock\w*",
        r"\bexception\b|\berrors?\b|\bfail(?:s|ure|ing)?\b|\bstuck\b|\btimeout\b",
    ),
    ("memory", r"\boom\b|out of memory|\bleak\w*", r"\bmemory\b|\balloc\w*|\bfree\b"),
)
_REFACTOR = re.compile(
    r"^(?:\[[^\]]*\]\s*)*(?:chore|ci|docs?|build|style|tests?|perf|refactor)\b"
    r"|\b(?:refactor\w*|renam\w*|move[sd]?|clean\s*up|cleanup|remove unused|simplif\w*)\b",
    re.I,
)
_FEATURE = re.compile(
    r"^(?:\[[^\]]*\]\s*)*(?:feat\b|add\b|adds\b|support\b|enable\b|introduce\b)", re.I
)
_ISSUE = re.compile(r"(?:[\w.-]+/[\w.-]+)?#(\d+)")
_ISSUE_URL = re.compile(r"github\.com/[\w.-]+/[\w.-]+/issues/(\d+)")


def fix_signal(merge: Merge) -> FixSignal:
    """The merge's fix-likeness (see the module's doc)."""
    subject, text = merge.subject, f"{merge.subject}\n{merge.body}"
    score, words = 0, []
    category = "other"
    found = _FIX.search(subject)
    if found:
        score += 3
        words.append(found.group(0).strip().lower())
        category = "fix"
    severity = _severity(text)
    if severity is not None:
        category, word, strength = severity
        score += 2 if strength == 1 else 1
        words.append(word)
    tests = tuple(f for f in merge.files if f.startswith("tests/"))
    score += 1 if tests else 0
    own = f"#{merge.pr}" if merge.pr else None
    issues = [f"#{m.group(1)}" for m in _ISSUE.finditer(text) if f"#{m.group(1)}" != own]
    issues += [f"#{n}" for n in _ISSUE_URL.findall(text)]
    issues = list(dict.fromkeys(issues))
    score += 1 if issues else 0
    refactor = _REFACTOR.search(subject)
    if refactor:
        score -= 3
        words.append(refactor.group(0).strip().lower())
        category = "refactor" if category in ("other", "fix") else category
    elif _FEATURE.search(subject):
        score -= 1
        category = "feature" if category == "other" else category
    return FixSignal(score, category, tuple(words), tests, tuple(issues))


def _severity(text: str) -> tuple[str, str, int] | None:
    """(category, the word, 1 strong or 2 weak) of the first symptom named, strong first."""
    for strength in (1, 2):
        for entry in _SEVERITY:
            hit = re.search(entry[strength], text, re.I)
            if hit:
                return entry[0], hit.group(0).lower(), strength
    return None


_OTHER_ENTRY_POINTS = (
    ("megatron/core/export/", "export"),
    ("megatron/core/post_training/", "post-training"),
    ("megatron/post_training/", "post-training"),
    ("megatron/rl/", "rl"),
    ("megatron/inference/", "inference"),
    ("megatron/elastification/", "elastification"),
)


def where(path: str) -> str:
    """Which kind of code ``path`` is (see the module's doc)."""
    folders, name = path.split("/")[:-1], path.rsplit("/", 1)[-1]
    if "experimental" in folders:
        return "experimental"
    if {"inference", "text_generation_server"} & set(folders) or "inference" in name:
        return "inference"
    for prefix, label in _OTHER_ENTRY_POINTS:
        if path.startswith(prefix):
            return label
    return "training"


def reach(merge: Merge) -> Reach:
    code = [f for f in merge.files if f.startswith("megatron/") and f.endswith(".py")]
    kinds = [where(f) for f in code]
    if "training" in kinds:
        first = code[kinds.index("training")]
        return Reach(True, "training", f"{first} is on a training path")
    if not kinds:
        return Reach(False, "none", "no megatron/ code")
    return Reach(False, kinds[0], f"{code[0]} is {kinds[0]} code only")
