"""Priorities, deduplication, time limits, rate limits, pausing
(docs/howto/priorities-rate-limits.md)."""

import echomq_django as emq

# settings.py: at most 10 claims a second on "api", by all workers together,
# and no attempt there may run longer than 10 s; at most 3 "partner" jobs
# running at once, and no more than 5 started in any second
QUEUES = {
    "api": {"RATE_LIMIT": {"MAX": 10, "PER_MS": 1000}, "TIMEOUT_MS": 10_000},
    "partner": {"CONCURRENCY": 3, "RATE_LIMIT": {"MAX": 5, "PER_MS": 1000, "MODE": "sliding"}},
}


def add_mail():
    """Higher priority first; FIFO within a priority."""
    emq.enqueue("mail", "mail.newsletter", {"batch": 1})  # priority 0
    emq.enqueue("mail", "mail.password_reset", {"user": 42}, priority=10)  # runs first
    emq.enqueue("mail", "mail.digest", {"user": 42}, priority=-5)  # runs last


def add_digest(user_id):
    """One digest per user at a time: while the first is live, another add
    writes nothing and returns the live job's id."""
    return emq.enqueue(
        "mail",
        "mail.digest",
        {"user": user_id},
        dedup_key=f"digest-{user_id}",
        dedup_ttl_ms=60_000,
    )


class TooManyRequests(Exception):
    """What your HTTP client raises on a 429, with the server's Retry-After."""

    def __init__(self, retry_after_s):
        super().__init__(f"429, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


@emq.handler("api.call")
def call_api(job):
    """A 429 puts the job back to wait, without spending an attempt."""
    try:
        return fake_api(job.payload)
    except TooManyRequests as exc:
        raise emq.RateLimited(int(exc.retry_after_s * 1000)) from exc


def fake_api(payload):
    if payload.get("throttle"):
        payload.pop("throttle")
        raise TooManyRequests(0.05)
    return {"ok": True}


def fulfil_order(order_id):
    """Failure policies and a deadline on one flow: what a child's death
    does to its parent."""
    return emq.add_flow(
        emq.Flow(
            "orders",
            "orders.fulfil",
            {"order": order_id},
            job_id=f"order-{order_id}",
            children_timeout_ms=600_000,  # the parent dies if its children take longer
            children=[
                # the default: a dead child fails its parent
                emq.Flow("payments", "orders.charge", {"order": order_id}),
                # recorded in the parent's ignored_failures(); the parent still waits
                emq.Flow(
                    "mail",
                    "mail.receipt",
                    {"order": order_id},
                    ignore_dependency_on_failure=True,
                ),
                # dropped: the parent stops waiting for it
                emq.Flow(
                    "crm",
                    "crm.sync",
                    {"order": order_id},
                    remove_dependency_on_failure=True,
                ),
                # its death releases the parent at once, without the others
                emq.Flow(
                    "inventory",
                    "inventory.reserve",
                    {"order": order_id},
                    continue_parent_on_failure=True,
                ),
            ],
        )
    )


def ease_off_partner():
    """The partner's API is struggling: one call at a time from now on, on
    every worker, without a deploy; back to the setting when it recovers."""
    emq.set_concurrency("partner", 1)
    return emq.get_concurrency("partner")


def partner_recovered():
    """Drop the run-time cap: the CONCURRENCY setting (3) applies again."""
    emq.set_concurrency("partner", None)
    return emq.get_concurrency("partner")
