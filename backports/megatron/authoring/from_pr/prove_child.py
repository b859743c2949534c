"""The child interpreter's side of step six: the contract kit on the installed plugin.

Run as ``python -P`` with the plugin's install folder on ``PYTHONPATH`` (the contract's own
fresh-interpreter check inherits it), in a private scratch folder. Writes one JSON answer:
each contract check's name and "ok" or what broke.
"""

import json
import sys
import traceback
from typing import Any


def main(argv: list[str]) -> int:
    with open(argv[0], encoding="utf-8") as handle:
        request = json.load(handle)
    answer: dict[str, Any] = {"checks": {}}
    try:
        from ._tool import contract, deactivate_start_up, spec_by_id

        deactivate_start_up()  # this process decides; the environment's hook must not
        spec = spec_by_id(request["id"])
        for check in contract():
            try:
                check(spec)
            except AssertionError as exc:
                answer["checks"][check.__name__] = f"failed: {(str(exc).splitlines() or [''])[0]}"
            except Exception as exc:
                answer["checks"][check.__name__] = f"error: {type(exc).__name__}: {exc}"
            else:
                answer["checks"][check.__name__] = "ok"
    except Exception as exc:
        answer["error"] = f"{type(exc).__name__}: {exc}"
        answer["traceback"] = traceback.format_exc(limit=-4)
    with open(argv[1], "w", encoding="utf-8") as handle:
        json.dump(answer, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
