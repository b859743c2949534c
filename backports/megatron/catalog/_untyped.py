"""Names for the untyped objects the catalog's sniffs handle.

mypy does not follow torch or megatron-core (``pyproject.toml``), and the sniffs import them
inside functions (importing the catalog imports neither): the checker cannot check these
values, but each name says what a value is.
"""

from collections.abc import Callable
from typing import Any

Tensor = Any  # a torch.Tensor
DType = Any  # a torch.dtype
MegatronObject = Any  # an instance of a megatron-core class
MegatronFunction = Callable[..., Any]  # a megatron-core function or method: returns untyped
