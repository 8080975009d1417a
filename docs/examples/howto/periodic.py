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
