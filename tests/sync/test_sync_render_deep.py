"""``sync`` reads upstream's source: a file too deeply nested to parse (a 10,000-term
expression) is one ``SourceError`` line, never a RecursionError traceback (issue 42)."""

import pytest

from backports.megatron.sync.errors import SourceError
from backports.megatron.sync.render import _parse


def test_a_source_too_deep_to_parse_is_one_source_error_line() -> None:
    deep = "LIMIT = " + " + ".join(["1"] * 10_000) + "\n"
    with pytest.raises(SourceError) as caught:
        _parse(deep, "megatron/core/deep.py at 0123456789ab")
    assert str(caught.value) == (
        "megatron/core/deep.py at 0123456789ab is too deeply nested to read (RecursionError)"
    )
