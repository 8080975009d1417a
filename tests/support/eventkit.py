"""Helpers for the durable-signal tests.

``Seen`` connects a receiver to every signal the dispatcher sends and keeps
what each one got; ``Raising`` is a receiver that raises (for some job ids);
``stream`` reads a queue's durable events as plain tuples. Run as a module
(``python -m tests.support.eventkit MODE URL CLUSTER ...``) this file is the child
process of the SIGKILL tests:

* ``dispatch URL CLUSTER BATCH KILL_AFTER`` runs one ``Dispatcher`` pass on
  queue ``q`` with a receiver that RPUSHes ``"<signal> <event_id> <job id>"``
  to the list ``seen``; with ``KILL_AFTER`` > 0 it SIGKILLs itself right
  after sending that many events (before the batch is acked);
* ``worker URL CLUSTER`` runs a burst ``Worker`` on ``q`` and SIGKILLs itself
  right after its first ``complete_many`` (or ``complete_then_claim``)
  returned: the transitions are in Redis, nothing after them ran.
"""

from __future__ import annotations

import os
import signal as _signal
import sys

from echomq_django import EchoMQ, signals
from echomq_django.protocol.signal_events import SIGNAL_OF
from tests.support.workerkit import Recorder

NAMES = tuple(SIGNAL_OF.values())


class Seen(Recorder):
    """Every durable signal sent while it is open: ``got`` is a list of
    ``(signal name, job_id, kwargs)`` in the order sent."""

    def __init__(self, names=NAMES) -> None:
        super().__init__(names)

    @property
    def got(self) -> list[tuple[str, str, dict]]:
        return [(name, kw["job_id"], kw) for name, _, kw in self.events]

    def pairs(self) -> list[tuple[str, str]]:
        """``(signal name, job_id)`` in the order sent."""
        return [(name, job_id) for name, job_id, _ in self.got]

    def ids(self) -> list[str]:
        return [kw["event_id"] for _, _, kw in self.got]


class Raising:
    """A ``job_completed`` receiver that raises ``RuntimeError("no <id>")``
    for the job ids in ``bad``; ``calls`` counts every call per job id."""

    def __init__(self, bad: set[str], name: str = "job_completed") -> None:
        self.bad, self.calls, self.signal = bad, {}, getattr(signals, name)
        self.signal.connect(self, weak=False)

    def __call__(self, sender, job_id, **kwargs):
        self.calls[job_id] = self.calls.get(job_id, 0) + 1
        if job_id in self.bad:
            raise RuntimeError(f"no {job_id}")

    def close(self) -> None:
        self.signal.disconnect(self)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else v


def stream(mq, queue: str = "q") -> list[tuple]:
    """The queue's undispatched events: ``(stream id, kind, job id, name, value)``."""
    out = []
    for xid, f in mq.client.xrange(mq.keys.queue_key(queue, "signals")):
        f = {_text(k): _text(v) for k, v in f.items()}
        out.append((_text(xid), f["k"], f["id"], f["n"], f.get("v")))
    return out


def _main(mode: str, url: str, cluster: str, *rest: str) -> None:
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=[], DATABASES={}, USE_TZ=True)
    django.setup()
    import redis
    from redis.cluster import RedisCluster

    client = RedisCluster.from_url(url) if cluster == "1" else redis.Redis.from_url(url)
    mq = EchoMQ(client, prefix="emq")
    if mode == "dispatch":
        from echomq_django.runners.dispatcher import Dispatcher

        batch, kill_after = int(rest[0]), int(rest[1])
        sent = []

        def record(sender, signal=None, **kw):
            name = next(n for n in NAMES if getattr(signals, n) is signal)
            client.rpush("seen", f"{name} {kw['event_id']} {kw['job_id']}")
            sent.append(1)
            if len(sent) == kill_after:
                os.kill(os.getpid(), _signal.SIGKILL)

        for name in NAMES:
            getattr(signals, name).connect(record, weak=False)
        Dispatcher(["q"], mq, batch=batch, lock_ms=300).dispatch_all()
    elif mode == "worker":
        from echomq_django import Worker, handler

        handler("leaf")(lambda job: job.payload)
        for name in NAMES:  # a worker with receivers: it subscribes their kinds
            getattr(signals, name).connect(lambda sender, **kw: None, weak=False)
        # its first completions, whichever way the reporter sends them (with a
        # claim of the queue when a parent waits there: complete_then_claim)
        for name in ("complete_many", "complete_then_claim"):
            real = getattr(mq, name)

            def then_die(*args, _real=real, **kwargs):
                replies = _real(*args, **kwargs)
                os.kill(os.getpid(), _signal.SIGKILL)
                return replies

            setattr(mq, name, then_die)
        Worker(["q"], concurrency=1, mq=mq).run(burst=True)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    _main(*sys.argv[1:])
