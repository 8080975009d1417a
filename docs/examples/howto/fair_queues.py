"""Fair queues for a SaaS: one group per customer (docs/howto/fair-queues.md).

The calls that add and steer the customers' jobs; their handlers are in
fair_queues_jobs.py (an app's ``jobs.py``); the ``ECHOMQ`` at the end goes in
``settings.py``."""

import echomq_django as emq


def customer(customer_id):
    """The group of one customer: a name without '{', '}', ':' or spaces."""
    return f"customer-{customer_id}"


def import_rows(customer_id, rows):
    """One job per row, all in the customer's group: a big import waits its
    own turn in the round, not everyone's."""
    group = customer(customer_id)
    jobs = [{"name": "tenant.import_row", "payload": row, "group": group} for row in rows]
    return emq.enqueue_many("tenant", jobs)


def reset_password(customer_id, user_id):
    """A small job of another customer: its group's next turn comes within
    one round, however long the import ahead of it."""
    return emq.enqueue(
        "tenant", "tenant.reset_password", {"user": user_id}, group=customer(customer_id)
    )


def give_more_room(customer_id):
    """A paying customer gets 5 at once, on every worker, without a deploy."""
    emq.set_group_concurrency("tenant", customer(customer_id), 5)
    return emq.get_group_concurrency("tenant", customer(customer_id))


def hold(customer_id):
    """Stop starting one customer's jobs (a failed payment, an incident);
    their adds go on and their running jobs finish."""
    return emq.pause_group("tenant", customer(customer_id))


def release(customer_id):
    return emq.resume_group("tenant", customer(customer_id))


# settings.py: on "tenant", at most 2 jobs of one customer run at once
ECHOMQ = {
    "URL": "redis://localhost:6379/0",
    "QUEUES": {"tenant": {"GROUP_CONCURRENCY": 2}},
}

QUEUES = ECHOMQ["QUEUES"]  # what tests/test_docs_examples.py runs the example with
