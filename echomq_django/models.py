"""The admin's read-only mirror of Redis (docs/explanation/house.md#monitoring).

Redis is the only source of truth; these rows are a cache the admin lists,
filters and searches, refreshed by ``monitoring/mirror.py`` (the pump's after-sweep
hook, ``./manage.py echomq_mirror`` and the admin's "refresh" button). Nothing
the queue does ever reads them. Both models have only the ``view`` default
permission, so no one (a superuser included, see admin.py) can be granted
add, change or delete; ``retry_job`` guards retry-by-id.
"""

from __future__ import annotations

from django.db import models

from .core.jobs import JobState

# Payload, result and error are stored trimmed to this many characters (the
# job page shows the full value, read live from Redis); ``truncated`` says
# whether any of the three was cut.
TEXT_LIMIT = 4096

STATE_CHOICES = [(s.value, s.value.replace("_", " ")) for s in JobState]


class MirroredJob(models.Model):
    """One job row ``P:{q}:job:<id>`` as last read from Redis (docs/explanation/protocol.md#keys).

    Timestamps are the row's ms fields as aware datetimes (None when unset).
    ``gone_from_redis`` is set when the row was no longer in Redis at the
    last mirror (retention, or a flushed server); the row is kept so the
    admin shows what was last seen. ``mirrored_at`` is when it was last read.
    """

    queue = models.CharField(max_length=64)
    job_id = models.CharField("job id", max_length=128)
    name = models.CharField(max_length=255)
    state = models.CharField(max_length=32, choices=STATE_CHOICES)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=1)
    parent_queue = models.CharField(max_length=64, blank=True)
    parent_id = models.CharField("parent id", max_length=128, blank=True)
    parent_policy = models.CharField(max_length=2, blank=True)
    created_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    payload = models.TextField(blank=True, help_text=f"JSON, trimmed to {TEXT_LIMIT} characters")
    result = models.TextField(blank=True, help_text=f"JSON, trimmed to {TEXT_LIMIT} characters")
    error = models.TextField(blank=True, help_text=f"trimmed to {TEXT_LIMIT} characters")
    truncated = models.BooleanField(default=False, help_text="payload, result or error was trimmed")
    progress = models.TextField(
        blank=True, help_text="the last progress its handler reported (JSON, at most 1,024 bytes)"
    )
    gone_from_redis = models.BooleanField(default=False)
    mirrored_at = models.DateTimeField()

    class Meta:
        verbose_name = "job"
        default_permissions = ("view",)
        permissions = (
            ("retry_job", "Can retry a dead job by id"),
            ("manage_job", "Can cancel and remove jobs, pause and resume queues"),
        )
        constraints = (
            models.UniqueConstraint(fields=["queue", "job_id"], name="emq_job_queue_id"),
        )
        indexes = (
            models.Index(fields=["queue", "state"], name="emq_job_queue_state"),
            models.Index(fields=["state"], name="emq_job_state"),
            models.Index(fields=["name"], name="emq_job_name"),
            models.Index(fields=["-created_at"], name="emq_job_created"),
            models.Index(fields=["parent_queue", "parent_id"], name="emq_job_parent"),
        )
        ordering = ("-created_at", "-id")

    def __str__(self) -> str:
        return f"{self.queue}/{self.job_id}"


class MirroredQueue(models.Model):
    """One queue's summary as last read from Redis.

    Counts are the lengths of its state indexes; ``outbox`` and
    ``deadletter`` the lengths of ``flow:outbox`` and ``flow:deadletter``;
    ``oldest_pending_age_s`` (seconds) is the longest wait among its heads,
    the queue's and each group's (docs/reference/stats.md#queues; None when
    none waits); ``last_event_id`` is the id of the
    last ``events`` stream entry the mirror has applied ('' before the first);
    ``claims_seen`` the queue's claim counter (``lease:seq``) at that pass.
    """

    queue = models.CharField(max_length=64, primary_key=True)
    pending = models.PositiveIntegerField(default=0)
    active = models.PositiveIntegerField(default=0)
    delayed = models.PositiveIntegerField(default=0)
    awaiting_children = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    dead = models.PositiveIntegerField(default=0)
    outbox = models.PositiveIntegerField("outbox depth", default=0)
    deadletter = models.PositiveIntegerField("dead-lettered entries", default=0)
    oldest_pending_age_s = models.FloatField("oldest pending age (s)", null=True, blank=True)
    last_event_id = models.CharField(max_length=64, blank=True)
    claims_seen = models.BigIntegerField(default=0)
    mirrored_at = models.DateTimeField()

    class Meta:
        verbose_name = "queue"
        default_permissions = ("view",)
        # the live-workers page's commands (docs/howto/operate-workers.md#from-the-admin)
        permissions = (
            ("command_worker", "Can send commands to workers: shutdown, drain, resize the pool"),
        )
        ordering = ("queue",)

    def __str__(self) -> str:
        return self.queue

    COUNT_FIELDS = (
        "pending",
        "active",
        "delayed",
        "awaiting_children",
        "completed",
        "dead",
        "outbox",
        "deadletter",
    )

    def counts(self) -> dict[str, int]:
        """The mirrored counts, keyed like ``EchoMQ.counts()``."""
        return {f: getattr(self, f) for f in self.COUNT_FIELDS}


class OutboxEntry(models.Model):
    """A job or flow added with ``on_commit`` whose transaction committed but
    that may not be in Redis yet: the durable enqueue of
    docs/explanation/protocol.md#the-commit-outbox.

    Written in the caller's transaction (so a rollback leaves nothing),
    pushed to Redis right after the commit and deleted; when Redis is down
    then, it stays until the worker or the pump drains the table, oldest
    first (``outbox.drain``). ``kind`` is ``job`` or ``flow``; ``queue`` and
    ``job_id`` name the job (a flow's root), fixed when the row is written so
    a push that is repeated lands nothing twice; ``body`` is the call as JSON
    (``outbox.py`` writes and reads it); ``tries`` counts failed pushes;
    ``error`` is set when Redis refused the push for good (an id taken by
    another job): such a row is kept, and skipped, until someone deletes it.
    """

    kind = models.CharField(max_length=4, choices=[("job", "job"), ("flow", "flow")])
    queue = models.CharField(max_length=64)
    job_id = models.CharField("job id", max_length=128)
    body = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")

    class Meta:
        verbose_name = "commit outbox entry"
        verbose_name_plural = "commit outbox"
        default_permissions = ("view",)
        ordering = ("id",)

    def __str__(self) -> str:
        return f"{self.kind} {self.queue}/{self.job_id}"


class PeriodicEntry(models.Model):
    """A periodic entry, as the admin's schedules page names it
    (docs/howto/periodic.md#the-admin-page). No table: the entries live in
    ``ECHOMQ["SCHEDULE"]`` (read-only) and in Redis (``emq.schedules``); the
    model exists for the page's permissions (``view``; ``change``: edit,
    pause and resume; ``run_periodicentry``: run one now) and for the admin
    log's rows, whose object id is the entry's name."""

    name = models.CharField(max_length=100, primary_key=True)

    class Meta:
        managed = False
        verbose_name = "periodic entry"
        verbose_name_plural = "periodic entries"
        default_permissions = ("view", "change")
        permissions = (("run_periodicentry", "Can run a periodic entry now"),)

    def __str__(self) -> str:
        return self.name
