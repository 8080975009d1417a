"""docs/howto/fair-queues.md: the handlers of the jobs fair_queues.py adds,
as an app's ``jobs.py`` holds them (the worker imports it at start)."""

import echomq_django as emq

DONE: list = []  # stands in for the work: (job name, payload), in the order run


@emq.handler("tenant.import_row")
def import_row(job):
    """One row of a customer's import: ``job.payload`` is the row."""
    DONE.append(("tenant.import_row", job.payload))  # in your app: save the row


@emq.handler("tenant.reset_password")
def send_password_reset(job):
    """``job.payload`` is ``{"user": <id>}``."""
    DONE.append(("tenant.reset_password", job.payload))  # in your app: send the e-mail
