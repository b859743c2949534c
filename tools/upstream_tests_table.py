#!/usr/bin/env python3
"""One Markdown table from the JSON files of ``backports upstream-tests ID --json``.

    python3 tools/upstream_tests_table.py OUT/upstream_tests_*.json --md OUT/upstream_tests.md

A row per test: the backport, the test id, its outcome stock and with the backport, the
judgement (a test proves the fix only where it fails stock and passes with it), and for
every test that proves nothing each run's first error line; then a line per entry with
its commit, launcher, the machine's torch and CUDA devices, exit status and summary. A file
that holds no JSON object (the command ended in an error) becomes a line saying so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from backports.megatron.upstream_tests.judgement import markdown


def _read(path: Path) -> dict[str, Any] | str:
    """The document, or why there is none."""
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        return f"{path.name}: no result ({type(exc).__name__}: {exc})"
    if not isinstance(doc, dict) or doc.get("command") != "upstream-tests":
        return f"{path.name}: not an upstream-tests --json document"
    return doc


def table(paths: list[Path]) -> str:
    found = [_read(path) for path in paths]
    docs = [doc for doc in found if isinstance(doc, dict)]
    text = markdown(docs) if docs else ""
    return text + "".join(f"- {why}\n" for why in found if isinstance(why, str))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", type=Path, help="upstream-tests --json outputs")
    parser.add_argument("--md", type=Path, help="write here (default: stdout)")
    args = parser.parse_args(argv)
    text = table(args.json)
    if args.md:
        args.md.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
