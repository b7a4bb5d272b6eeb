"""The fence: an attempt whose lease a runner could not renew in time is stopped before the
lease ends, so a cut-off runner never overlaps the job's next attempt elsewhere."""

from __future__ import annotations

DEFAULT_FENCE_SHARE = 0.25
"""Without a configured fence_margin, attempts stop a quarter of the lease before it ends."""


def fence_margin(lease: float, configured: float | None) -> float:
    """The configured margin, or a quarter of the lease when none is set or it does not
    fit inside the lease (the server's lease may be shorter than the local config's)."""
    if configured is None or configured >= lease:
        return lease * DEFAULT_FENCE_SHARE
    return configured


def fence_due(renewed: float, now: float, lease: float, margin: float) -> bool:
    """Whether an attempt last renewed at `renewed` must be stopped now (monotonic times)."""
    return now >= renewed + lease - margin


FENCE_KILL_SHARE = 0.75
"""A fenced attempt's SIGKILL comes within this share of what is left of its lease; the
rest is headroom for the kill itself on a busy machine."""


def fence_kill_at(now: float, lease_end: float, kill_grace: float) -> float:
    """When a fenced attempt's SIGTERM escalates to SIGKILL: after `kill_grace`, but soon
    enough that the tree is gone before anyone else may run the job (at once if the lease
    has run out already)."""
    return min(now + kill_grace, now + max(0.0, lease_end - now) * FENCE_KILL_SHARE)
