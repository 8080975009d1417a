"""``mq.progress``: what a running job reports, its progress and its job log
(docs/explanation/protocol.md#progress-and-log-lines).

Each write is one script under the job's lease, checked on the host first
(core/live.py: the progress rule, a log line cut with a marker), so bad
input writes nothing: ``lua/report_progress.lua`` sets the row's
``progress`` field and writes a ``progress`` entry to the queue's events
stream; ``lua/append_log.lua`` appends to the job log
``P:{q}:job:<id>:logs``, kept to the queue's ``KEEP_LOGS`` lines;
``lua/update_payload.lua`` replaces a step job's payload
(docs/explanation/protocol.md#step-jobs). None touches the lease deadline,
so none races the job's heartbeat. The lines are read by
``EchoMQ.job_logs`` (the read API, ``reads.py``).
"""

from __future__ import annotations

from typing import Any

from ...core.exceptions import PayloadError
from ...core.jobs import Job
from ...core.live import log_line, progress_text
from ..wire import Part


class Progress(Part):
    """The writes a handler makes through its ``Job``
    (``job.report_progress``, ``job.log``)."""

    def report(self, job: Job, value: Any) -> None:
        """Set ``job``'s progress to ``value`` (a number 0-100 or a JSON
        object of at most ``core.live.MAX_PROGRESS_BYTES`` bytes) under its
        lease. Raises ``PayloadError`` naming the rule for a bad value
        (nothing written); ``JobNotFound``, ``JobNotActive``, ``LeaseLost``
        (nothing written); ``RedisUnavailable``.
        docs/howto/progress-and-logs.md#report-progress"""
        try:
            text = progress_text(value, lambda v: self.wire.encode(v, "progress"))
        except PayloadError:
            raise
        except ValueError as err:
            raise PayloadError(str(err)) from None
        k = self.keys.queue(job.queue)
        self.scripts.run(
            "report_progress",
            [k.job(job.id), k.events],
            [job.queue, job.id, job.lease or "", text],
        )

    def log(self, job: Job, line: str) -> int:
        """Append ``line`` (a str; cut to ``core.live.MAX_LOG_LINE_BYTES``
        bytes with a marker when longer) to ``job``'s log under its lease;
        the log keeps the queue's newest ``KEEP_LOGS`` lines. Returns the
        lines the log held once this one was added (before the trim).
        Raises ``TypeError`` / ``ValueError`` for a line that is not text
        (nothing written); ``JobNotFound``, ``JobNotActive``, ``LeaseLost``;
        ``RedisUnavailable``. docs/howto/progress-and-logs.md#write-log-lines"""
        text = log_line(line)
        keys = self.keys.job_keys(job.queue, job.id)
        return int(
            self.scripts.run(
                "append_log",
                [keys.row, keys.logs],
                [
                    job.queue,
                    job.id,
                    job.lease or "",
                    self.wire.setting(job.queue, "KEEP_LOGS"),
                    text,
                ],
            )
        )

    def update_payload(self, job: Job, payload: Any) -> None:
        """Replace ``job``'s stored payload with ``payload`` (any JSON
        value, checked and encoded on the host first: at most
        ``max_payload_bytes``) under its lease. Raises ``PayloadError``
        (nothing written); ``JobNotFound``, ``JobNotActive``, ``LeaseLost``
        (nothing written); ``RedisUnavailable``.
        docs/howto/step-jobs.md#update-the-payload"""
        text = self.wire.encode(payload, "payload")
        self.scripts.run(
            "update_payload",
            [self.keys.job(job.queue, job.id)],
            [job.queue, job.id, job.lease or "", text, self.clock()],
        )
