"""An entry whose targets live in several modules (#6010: LLaVA and MiMo) is judged and
installed as soon as one of its modules is imported, unless it declares them coupled.

Each test runs in a fresh interpreter: the point is a process that has imported LLaVA and
never MiMo, which a test process that ran other tests may not be any more.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

ID = "megatron-lm-6010"
LLAVA = "megatron.core.models.multimodal.llava_model"
MIMO = "megatron.core.models.mimo.model.base"

_SEEN = """
import json, sys
def seen(**what):
    print("SEEN " + json.dumps(what), flush=True)
def llava_patched():
    from megatron.core.models.multimodal.llava_model import LLaVAModel
    return getattr(vars(LLaVAModel)["forward"], "__backport__", None)
"""


def _run(script: str, tmp_path) -> list[dict[str, object]]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MEGATRON_BACKPORTS")}
    environ["MEGATRON_BACKPORTS_CACHE"] = "0"
    # #6507's sniff runs megatron's optimizer builder, which imports MiMo's model module (as
    # upstream's builder does on every call): with it on, no process stays without MiMo.
    environ["MEGATRON_BACKPORTS_SKIP"] = "megatron-lm-6507"
    environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_SEEN) + textwrap.dedent(script)],
        env=environ,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("SEEN ")]


@pytest.mark.slow
def test_a_job_that_imports_llava_alone_gets_6010_through_the_start_up_hook(tmp_path):
    seen = _run(
        f"""
        import backports.megatron as backports
        backports._start_up(("megatron",), {{"strict": False, "only": None}})
        import megatron.core
        seen(step="megatron", mimo={MIMO!r} in sys.modules, llava={LLAVA!r} in sys.modules)
        import {LLAVA}
        from backports.megatron.api import last_report
        report = last_report({ID!r})
        seen(step="llava", patched=llava_patched(), action=str(report.action),
             brought=report.evidence.get("imported_to_judge"))
        """,
        tmp_path,
    )
    assert seen == [
        {"step": "megatron", "mimo": False, "llava": False},
        {"step": "llava", "patched": ID, "action": "installed", "brought": [MIMO]},
    ]


@pytest.mark.slow
def test_apply_after_importing_llava_alone_installs_and_a_coupled_entry_waits(tmp_path):
    seen = _run(
        f"""
        from dataclasses import replace
        import {LLAVA}
        from backports.megatron import apply
        from backports.megatron.catalog import entries
        from backports.megatron.decision import decide
        spec = next(s for s in entries() if s.id == {ID!r})
        coupled = decide(replace(spec, coupled=True), "local-changes", importing=False,
                         child_sniffs=False)
        seen(step="coupled", verdict=coupled.verdict, mimo={MIMO!r} in sys.modules,
             names_mimo={MIMO!r} in coupled.reason and "coupled" in coupled.reason)
        (report,) = apply({ID!r})
        seen(step="apply", action=str(report.action), patched=llava_patched(),
             targets=[t["attribute"] for t in report.evidence["targets"]],
             brought=report.evidence.get("imported_to_judge"))
        """,
        tmp_path,
    )
    assert seen == [
        {"step": "coupled", "verdict": None, "mimo": False, "names_mimo": True},
        {
            "step": "apply",
            "action": "installed",
            "patched": ID,
            "targets": [
                "LLaVAModel.forward",
                "MimoModel._forward_all_modules",
                "MimoModel._forward_language_module",
            ],
            "brought": [MIMO],
        },
    ]
