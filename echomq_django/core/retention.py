"""Retention settings: what a queue keeps of its finished jobs (docs/explanation/lifecycle.md).

Nothing in Redis grows for ever: finished jobs leave by their queue's
retention (``KEEP_COMPLETED``, ``KEEP_DEAD``) or their own ``keep``, and an
operator can remove or cancel a job with its subtree by id.

The calls that apply it are ``mq.lifecycle``'s (protocol/lifecycle.py).

Settings (per queue in ``ECHOMQ["QUEUES"]``), each a count (keep the newest
N) or ``{"COUNT": n, "AGE_S": s}`` (either bound may be left out, not both);
defaults: completed 1,000 and 1 day, dead 10,000 and 14 days.
"""

from __future__ import annotations

from dataclasses import dataclass

UNBOUNDED = 10**15  # a count or an age (ms) that never binds
KEEP_KEYS = ("KEEP_COMPLETED", "KEEP_DEAD")
KEEP_PARTS = {"COUNT", "AGE_S"}
DEFAULT_KEEP = {
    "KEEP_COMPLETED": {"COUNT": 1000, "AGE_S": 86400},
    "KEEP_DEAD": {"COUNT": 10000, "AGE_S": 14 * 86400},
}


@dataclass(frozen=True)
class Keep:
    """One retention rule: keep at most ``count`` jobs, none older than
    ``age_s`` seconds after it finished; None: no bound on that axis."""

    count: int | None
    age_s: int | None

    def args(self) -> list[int]:
        """The rule as script ARGV: count, age (ms)."""
        return [
            UNBOUNDED if self.count is None else self.count,
            UNBOUNDED if self.age_s is None else self.age_s * 1000,
        ]


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def keep_problems(value) -> list[tuple[str, str]]:
    """What is wrong with one ``KEEP_*`` value, as ``(check id, message)``
    pairs (empty: nothing). Settings only; used by the system checks
    (echomq_django.E020-E023) and ``parse_keep``."""
    if _whole(value):
        return []
    if not isinstance(value, dict):
        return [("E020", f"must be a whole number >= 0 (a count) or a dict, got {value!r}")]
    out = []
    unknown = sorted(map(str, set(value) - KEEP_PARTS))
    if unknown:
        out.append(("E021", f"has unknown keys {unknown}"))
    if not set(value) & KEEP_PARTS:
        out.append(("E022", "needs COUNT or AGE_S (or both)"))
    for part in sorted(KEEP_PARTS & set(value)):
        if not _whole(value[part]):
            out.append(("E023", f"{part} must be a whole number >= 0, got {value[part]!r}"))
    return out


KEEP_HINT = (
    "A count keeps the newest N (e.g. 1000); {'COUNT': n, 'AGE_S': s} also drops "
    "what finished more than s seconds ago (either bound may be left out, not both)."
)


def parse_keep(value, what: str = "keep") -> Keep:
    """A ``KEEP_*`` value as a ``Keep``. Raises ``ValueError`` naming the rule."""
    problems = keep_problems(value)
    if problems:
        raise ValueError(f"{what} {'; '.join(m for _, m in problems)}. {KEEP_HINT}")
    if _whole(value):
        return Keep(value, None)
    return Keep(value.get("COUNT"), value.get("AGE_S"))


def retention(opts: dict) -> tuple[Keep, Keep]:
    """``(completed, dead)`` rules of a queue's options (``ECHOMQ["QUEUES"][q]``):
    its ``KEEP_*`` settings, else the defaults. Raises ``ValueError``."""
    return tuple(parse_keep(opts.get(k, DEFAULT_KEEP[k]), k) for k in KEEP_KEYS)


def job_keep(keep) -> str:
    """A job's own ``keep`` as the row's field text: seconds (int >= 0) it is
    kept after it finishes at most (0: retention's next step takes it), as
    ms; '' for None (its queue's rules). Raises ``ValueError``."""
    if keep is None:
        return ""
    if not _whole(keep):
        raise ValueError(
            f"keep must be a whole number of seconds >= 0 (or None for the queue's "
            f"retention), got {keep!r}"
        )
    return str(keep * 1000)
