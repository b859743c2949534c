"""Where the repository's own files are, for a test in any folder of the test tree (a
``Path(__file__).parents[n]`` of a test's own would point elsewhere once the file moves)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: backports/, docs/, tools/, vendor/
