"""Where the repository's own files are, for a test in any folder of the test tree (tests
move between folders; a ``Path(__file__).parents[n]`` of their own would then point wrong)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: backports/, docs/, tools/, vendor/
TOOLS = ROOT / "tools"
DOCS = ROOT / "docs"
