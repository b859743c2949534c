"""The decision path as the tests call it: one backport decided the way ``status`` decides
(every target imported, every sniff run), or its early evidence alone."""

from backports.megatron import switches
from backports.megatron.decision import Decision, decide
from backports.megatron.decision.early import Early, early_evidence
from backports.megatron.evidence.one_look import one_look
from backports.megatron.model import BackportSpec, mode_name


def probe(spec: BackportSpec, upstream_only: bool | None = None) -> Decision:
    """``decide`` as ``status`` runs it, in the mode asked (default: the switch's)."""
    if upstream_only is None:
        upstream_only = switches.upstream_only()
    with one_look():
        return decide(spec, mode_name(upstream_only), importing=True, child_sniffs=True)


def early(spec: BackportSpec) -> Early:
    """What needs no import of megatron: ``verdict`` None when the targets must decide."""
    return early_evidence(spec)


def resolve_target(target, backport_id):  # type: ignore[no-untyped-def]
    """The target as its kind resolves it (importing its modules)."""
    from backports.megatron.kinds import kind_of

    return kind_of(target).resolve(target, backport_id)


def sniff_replacement(spec, module, *, upstream_only, targets=None):  # type: ignore[no-untyped-def]
    """The entry's sniff on what the applier would install from ``module`` (the decision's
    ``sniff_vendored``), on ``targets`` as resolved (default: resolved there)."""
    from backports.megatron.decision import sniff_vendored

    return sniff_vendored(spec, module, upstream_only=upstream_only, targets=targets)
