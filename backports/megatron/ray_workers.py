"""Ray's counterpart of ``verify_ranks()``: whether a job's Ray workers run the same backports.

A Ray job has no process group to all-gather over: the driver asks each worker what it
installed (``installed_backports()``: id -> sha256 of the vendored file) and compares.
Actors are asked through ``__ray_call__``, which runs a function on the actor itself, so
the actor class needs no method of ours. Ray is imported only when actors are asked.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import BackportError
from .job.ranks import disagreement, installed_backports

__all__ = ["verify_actors", "verify_sets"]

_ADVICE = (
    "Workers running different code diverge silently; apply the same backports in every "
    "worker (`backports apply` in the workers' environment, or ray.init(runtime_env="
    "{'worker_process_setup_hook': 'backports.megatron.apply'}), and the same "
    "MEGATRON_BACKPORTS* variables)."
)


def verify_sets(sets: Sequence[Mapping[str, str]], noun: str = "worker") -> dict[str, str]:
    """Check that every gathered ``installed_backports()`` equals the first; return it.

    For what tasks (or any code) returned from their workers; ``verify_actors`` gathers
    from actors itself. Raises ``BackportError`` naming the workers (by index in ``sets``)
    that differ from worker 0, and what each runs. No sets: nothing to compare, ``{}``.
    """
    if not sets:
        return {}
    found = disagreement(range(len(sets)), sets, noun)
    if found is not None:
        raise BackportError(f"megatron-backports differ across Ray {noun}s; {found} {_ADVICE}")
    return dict(sets[0])


def _installed_in_actor(_actor: object) -> dict[str, str]:
    # Module-level, so Ray pickles it by reference: the actor imports this module.
    return installed_backports()


def verify_actors(actors: Sequence[Any], timeout: float | None = 300.0) -> dict[str, str]:
    """Ask each Ray actor which backports it installed and check they agree; return the set.

    Call from the driver after the actors imported megatron's target modules (built their
    model): a deferred backport installs on that import, so an actor that has not imported
    them yet reports none. ``BackportError`` names the actors (by index in ``actors``) that
    differ from actor 0; Ray's own errors (a dead actor, ``timeout`` seconds passed) pass on.
    """
    try:
        import ray
    except ImportError as exc:
        raise BackportError(f"verify_actors() needs ray: {exc}") from None
    try:
        calls = [actor.__ray_call__ for actor in actors]
    except AttributeError:
        raise BackportError(
            "verify_actors() needs Ray actor handles with __ray_call__; gather "
            "installed_backports() from each worker yourself and pass the results to verify_sets()"
        ) from None
    sets = ray.get([call.remote(_installed_in_actor) for call in calls], timeout=timeout)
    return verify_sets(sets, "actor")
