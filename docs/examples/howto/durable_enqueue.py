"""Enqueue inside a transaction (docs/howto/durable-enqueue.md).

The job is written to the ``echomq_django_outboxentry`` table in the same
transaction as your rows, pushed to Redis right after the commit, and
pushed later by the worker or the pump if Redis is down at that moment.
"""

from django.contrib.auth.models import User
from django.db import transaction

import echomq_django as emq


def sign_up(username, email):
    """Creates the user and enqueues their welcome mail: both or neither."""
    with transaction.atomic():
        user = User.objects.create(username=username, email=email)
        job_id = emq.enqueue(
            "mail",
            "mail.welcome",
            {"user": user.pk},
            on_commit=True,  # the default inside atomic(); written here for the reader
        )
    return user, job_id  # job_id is known before the commit


def sign_up_then_fail(username):
    """A rollback: neither the user nor the job exists afterwards."""
    with transaction.atomic():
        user = User.objects.create(username=username)
        emq.enqueue("mail", "mail.welcome", {"user": user.pk}, on_commit=True)
        raise ValueError("the sign-up form was invalid after all")
