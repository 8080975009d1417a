"""Retention (docs/howto/retention.md): how long finished jobs stay."""

import echomq_django as emq

# settings.py
ECHOMQ = {
    "URL": "redis://127.0.0.1:6379/0",
    "QUEUES": {
        "mail": {
            "KEEP_COMPLETED": 100,  # the newest 100 completed jobs
            "KEEP_DEAD": {"COUNT": 10_000, "AGE_S": 30 * 86400},  # the newest 10,000, 30 days
        },
        "reports": {"KEEP_COMPLETED": {"AGE_S": 3600}},  # an hour, however many
    },
}


def send_receipt(order_id):
    """A job nobody reads back: gone at the next retention step once done."""
    return emq.enqueue("mail", "mail.receipt", {"order": order_id}, keep=0)


def start_report(report_id):
    """A flow kept an hour at most once finished (``keep`` in seconds)."""
    return emq.add_flow(
        emq.Flow(
            "reports",
            "wordcount.total",
            {},
            job_id=f"report-{report_id}",
            keep=3600,
            children=[emq.Flow("counting", "wordcount.count", {"text": "kept an hour"})],
        )
    )
