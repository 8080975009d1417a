"""Periodic jobs (docs/howto/periodic.md): the handlers in an app's
``jobs.py``, the schedule in settings."""

import echomq_django as emq


@emq.handler("reports.nightly")
def nightly(job):
    """Runs at 03:00 every day (the entry's time zone)."""
    return {"sent": True}


@emq.handler("ops.ping")
def ping(job):
    """Runs every minute."""
    return "pong"


# settings.py
SCHEDULE = {
    "nightly-report": {
        "name": "reports.nightly",
        "queue": "reports",
        "cron": "0 3 * * *",  # needs croniter: pip install 'echomq-django[cron]'
        "tz": "Europe/Paris",  # default: Django's TIME_ZONE
    },
    "heartbeat": {"name": "ops.ping", "queue": "ops", "every_s": 60, "payload": {"from": "cron"}},
}
# ECHOMQ = {..., "SCHEDULE": SCHEDULE}


def follow_customer(customer_id, every_s=300):
    """A customer turned on sync in your app: poll their feed every
    ``every_s`` s from now on, on every pump, without a deploy. Returns the
    entry as ``emq.schedules.list()`` shows it."""
    return emq.schedules.upsert(
        f"sync-{customer_id}",
        handler="ops.ping",
        queue="ops",
        every_s=every_s,
        payload={"customer": customer_id},
    )


def unfollow_customer(customer_id):
    """Sync turned off: no more jobs from the entry (those it added stay)."""
    return emq.schedules.remove(f"sync-{customer_id}")
