"""``mq.progress``: what a running job reports, its progress and its job log
(docs/explanation/protocol.md#progress-and-log-lines).

Each write is checked on the host first (core/live.py: the progress rule, a
log line cut with a marker), so bad input writes nothing. ``write_many``
sends the writes of many running jobs, one ``lua/write_reports.lua`` call
per queue (pipelined when there are several): each job's progress replaces
the row's ``progress`` field and becomes a ``progress`` entry on the
queue's events stream; its lines go to the job log (its oldest line,
when short, in the row's ``lg``, the others in ``P:{q}:job:<id>:logs``),
kept to the queue's ``KEEP_LOGS`` lines. Every
job's writes are checked against its lease in the script; none touches the
lease deadline, so none races the job's heartbeat. A worker gathers its
handlers' writes and sends them with ``write_many`` (runners/flusher.py);
a job outside a worker writes at once (``write``). The writes of a job
the worker completes ride its ``complete`` call instead (``carried``): one
script writes them, then completes it.
``lua/update_payload.lua`` replaces a step job's payload at once, under its
lease (docs/explanation/protocol.md#step-jobs). The lines are read by
``EchoMQ.job_logs`` (the read API, ``reads.py``).
"""

from __future__ import annotations

import json
from typing import Any

from ...core.exceptions import PayloadError
from ...core.jobs import Job
from ...core.live import log_line, progress_text
from ..errors import translate
from ..wire import Part, local

PER_ENTRY = 1000  # a job's values and lines per entry of a call (Lua's unpack: a stack limit)

# A call's jobs go as one JSON array of strings and counts (ARGV[4] of
# write_reports.lua): one argument for the client to pack instead of six a job,
# which cost it several times more than the rest of the send. UTF-8 kept as it is
# (not \u-escaped): the C encoder, built once.
_FLAT = json.encoder.c_make_encoder and json.encoder.c_make_encoder(
    None, None, json.encoder.encode_basestring, None, ":", ",", False, False, False
)


def flat_json(items: list) -> str:
    """``items`` (a flat list of str and int) as one compact JSON array,
    non-ASCII text kept as UTF-8."""
    if _FLAT is not None:
        return "".join(_FLAT(items, 0))
    return json.dumps(items, ensure_ascii=False, separators=(",", ":"))


class Progress(Part):
    """The writes a handler makes through its ``Job``
    (``job.report_progress``, ``job.log``)."""

    @local
    def progress_text(self, value: Any) -> str:
        """``value`` checked and encoded as a row keeps it (a number 0-100 or
        a JSON object of at most ``core.live.MAX_PROGRESS_BYTES`` bytes).
        Raises ``PayloadError`` naming the rule for a bad value.
        docs/howto/progress-and-logs.md#report-progress"""
        try:
            return progress_text(value, lambda v: self.wire.encode(v, "progress"))
        except PayloadError:
            raise
        except ValueError as err:
            raise PayloadError(str(err)) from None

    @staticmethod
    def log_line(line: str) -> str:
        """``line`` as the job log keeps it (``core.live.log_line``: cut to
        ``MAX_LOG_LINE_BYTES`` bytes with a marker). Raises ``TypeError`` /
        ``ValueError`` for a line that is not text."""
        return log_line(line)

    def write(self, job: Job, progress: list[str], lines: list[str]) -> None:
        """Write ``job``'s checked ``progress`` values (JSON texts, in order)
        and ``lines`` now, in one script under its lease. Raises
        ``JobNotFound``, ``JobNotActive``, ``LeaseLost`` (nothing written);
        ``RedisUnavailable``."""
        (reply,) = self.write_many([(job, progress, lines)])
        if isinstance(reply, Exception):
            raise reply

    def write_many(self, items: list[tuple[Job, list[str], list[str]]]) -> list[int | Exception]:
        """Send ``(job, progress values, lines)`` items (checked by
        ``progress_text`` / ``log_line``) in one round trip: one
        ``write_reports`` call per queue, pipelined. Returns per item the
        lines its job log held after its lines, or the exception of a job
        the script refused (``JobNotFound``, ``JobNotActive``,
        ``LeaseLost``: nothing written for it). Raises ``RedisUnavailable``
        when Redis cannot be reached (nothing known written)."""
        calls, owners = self.calls(items)
        return self.replies(len(items), owners, self.run(calls))

    def run(self, calls: list) -> list:
        """Send ``calls`` (from ``calls``) in one round trip; their replies,
        an exception for each refused. Raises ``RedisUnavailable``."""
        if len(calls) == 1:
            return [self.wire.run_or_error(*calls[0])]
        return self.scripts.run_many(calls)

    @local
    def calls(self, items: list[tuple[Job, list[str], list[str]]]) -> tuple[list, list]:
        """The ``write_reports`` calls ``(name, keys, args)`` that send
        ``items`` (as ``write_many``), one per queue, and for each the index
        in ``items`` of each of its job entries (for ``replies``)."""
        by_queue: dict[str, tuple[list, list]] = {}
        for i, (job, progress, lines) in enumerate(items):
            flat, idx = by_queue.setdefault(job.queue, ([], []))
            if len(progress) <= PER_ENTRY and len(lines) <= PER_ENTRY:  # the usual job
                flat += (job.id, job.lease or "", len(progress), len(lines), *progress, *lines)
                idx.append(i)
                continue
            for at in range(0, max(len(progress), len(lines)), PER_ENTRY):
                p, n = progress[at : at + PER_ENTRY], lines[at : at + PER_ENTRY]
                flat += (job.id, job.lease or "", len(p), len(n), *p, *n)
                idx.append(i)
        calls, owners = [], []
        for queue, (flat, idx) in by_queue.items():
            k = self.keys.queue(queue)
            args = [queue, k.base, self.wire.setting(queue, "KEEP_LOGS"), flat_json(flat)]
            calls.append(("write_reports", [k.events], args))
            owners.append(idx)
        return calls, owners

    @local
    def carried(self, queue: str, pairs: list, carry: dict) -> str:
        """The pending writes of ``pairs``' jobs (``(job, result)`` of
        ``queue``), popped from ``carry`` (``id(job)`` -> ``(job, progress
        values, lines)``, each list of at most ``PER_ENTRY``), as ARGV[5] of
        ``lua/complete.lua``: the lines kept, then ``write_reports``' entries
        for them; '' when none of them has any
        (docs/explanation/protocol.md#progress-and-log-lines)."""
        flat: list = [0]  # the lines kept, once there are entries
        pop = carry.pop
        for job, _ in pairs:
            entry = pop(id(job), None)
            if entry is not None:
                _, progress, lines = entry
                flat += (job.id, job.lease or "", len(progress), len(lines), *progress, *lines)
        if len(flat) == 1:
            return ""
        flat[0] = self.wire.setting(queue, "KEEP_LOGS")
        return flat_json(flat)

    @staticmethod
    def replies(n: int, owners: list, replies: list) -> list[int | Exception]:
        """The ``n`` items' answers (as ``write_many`` returns them) from the
        replies of the ``calls`` whose ``owners`` these are."""
        out: list[int | Exception] = [0] * n
        for idx, reply in zip(owners, replies, strict=True):
            if isinstance(reply, list):  # "<held> <held> -1 ...", then each refusal's error
                errors = iter(reply[1:])
                entries = [h if h >= 0 else next(errors) for h in map(int, reply[0].split())]
            else:  # the whole call failed
                entries = [reply] * len(idx)
            for i, entry in zip(idx, entries, strict=True):
                if isinstance(out[i], Exception):
                    continue  # an earlier entry of the same job was refused
                if isinstance(entry, bytes | str):
                    out[i] = translate(entry.decode() if isinstance(entry, bytes) else entry)
                else:
                    out[i] = entry if isinstance(entry, Exception) else int(entry)
        return out

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
