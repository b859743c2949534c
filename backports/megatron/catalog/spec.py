"""The model types under their old address (plugins written before ``backports.megatron.model``
import them from here); ``backports.megatron.model`` defines them."""

from ..model import BackportSpec, LocalChange, Sniff, SniffResult, Target, VendoredRef

__all__ = ["BackportSpec", "LocalChange", "Sniff", "SniffResult", "Target", "VendoredRef"]
