"""After: the same work as one echomq flow (docs/howto/migrate.md)."""

import echomq_django as emq


@emq.handler("migrate.count")
def count(job):
    return len(job.payload["text"].split())


@emq.handler("migrate.total")
def total(job):
    # the children's results, handed to the parent: no result backend to poll
    return sum(job.children_values().values())


def count_words(texts):
    return emq.add_flow(
        emq.Flow(
            "default",
            "migrate.total",
            {},
            children=[emq.Flow("default", "migrate.count", {"text": t}) for t in texts],
        )
    )


def notify_later(user_id):
    """RQ's ``enqueue_in`` / Celery's ``countdown``: ``delay_ms``."""
    return emq.enqueue("default", "migrate.count", {"text": f"user {user_id}"}, delay_ms=60_000)
