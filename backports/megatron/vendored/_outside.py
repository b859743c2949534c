"""What the vendored-folder model takes from the rest of the package, named in this one place
(issue 32 moves these modules into wings: re-point the imports here, nowhere else)."""

from ..errors import BackportError
from ..local_changes import wrap_all
from ..model import BackportSpec, VendoredRef

__all__ = ["BackportError", "BackportSpec", "VendoredRef", "wrap_all"]
