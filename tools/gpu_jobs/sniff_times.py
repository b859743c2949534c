"""How long each entry's sniff takes on this host, cache off: one ``status(only=ID)`` per
entry in this process, after CUDA is up (as in a training job). Where one runs past
``--stall`` seconds, every thread's stack is written to stderr (faulthandler), so a sniff
that hangs on a GPU host shows where.

    python3 tools/gpu_jobs/sniff_times.py --json OUT.json [--stall 45] [--cuda]
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--stall", type=float, default=45.0)
    parser.add_argument("--cuda", action="store_true", help="initialise CUDA first")
    args = parser.parse_args()
    os.environ["MEGATRON_BACKPORTS_CACHE"] = "0"
    import torch

    if args.cuda:
        torch.zeros(1, device="cuda")
    from backports.megatron import status
    from backports.megatron.catalog import CATALOG

    rows = []
    for spec in CATALOG:
        faulthandler.dump_traceback_later(args.stall, exit=False, file=sys.stderr)
        start = time.monotonic()
        (report,) = status(only=spec.id)
        seconds = time.monotonic() - start
        faulthandler.cancel_dump_traceback_later()
        verdict = f"{report.verdict}/{report.action}"
        rows.append(
            {
                "id": spec.id,
                "seconds": round(seconds, 2),
                "verdict": verdict,
                "reason": report.reason[:300],
            }
        )
        print(f"{spec.id:22} {seconds:7.2f} s  {verdict}", flush=True)
    with open(args.json, "w") as handle:
        json.dump({"cuda": torch.cuda.is_available(), "rows": rows}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
