"""Helpers for the worker, signal and runworker tests.

Everything talks to the real test Redis. ``Clock`` is a fake ms clock for
``EchoMQ(clock=...)``, the one fake the tests allow; ``Recorder`` collects every
echomq_django signal; ``Background`` runs a ``Worker`` on a thread;
``wait_for`` polls a condition (a bound, never an assertion about time).
"""

from __future__ import annotations

import threading
import time

from echomq_django import EchoMQ, Worker, signals

T0 = 1_700_000_000_000  # ms
SIGNALS = ("job_completed", "job_failed", "job_dead", "parent_released", "flow_failed")


class Clock:
    """A controllable ms clock."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


def burst(mq: EchoMQ, queues, concurrency: int = 4, **kw) -> tuple[Worker, int]:
    """Run a burst worker on ``queues``; returns it and how many it processed."""
    worker = Worker(list(queues), concurrency=concurrency, mq=mq, **kw)
    return worker, worker.run(burst=True)


def wait_for(predicate, timeout: float = 15.0, what: str = "condition"):
    """Poll ``predicate`` every 10 ms; returns its truthy value. Fails the
    test (AssertionError) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


class Recorder:
    """Connects a receiver to every echomq_django signal; ``events`` is a list
    of ``(signal name, sender, kwargs)`` in the order sent."""

    def __init__(self, names=SIGNALS) -> None:
        self.events: list[tuple[str, object, dict]] = []
        self._receivers = []
        for name in names:

            def receive(sender, signal=None, _name=name, **kwargs):
                self.events.append((_name, sender, kwargs))

            getattr(signals, name).connect(receive, weak=False)
            self._receivers.append((name, receive))

    def close(self) -> None:
        for name, receive in self._receivers:
            getattr(signals, name).disconnect(receive)

    def names(self) -> list[tuple[str, str]]:
        """``(signal, job_id)`` pairs, sorted."""
        return sorted((name, kw["job_id"]) for name, _, kw in self.events)

    def of(self, name: str, job_id: str) -> list[dict]:
        return [kw for n, _, kw in self.events if n == name and kw["job_id"] == job_id]


class Background:
    """``worker.run(**kwargs)`` on a thread; ``join()`` returns its result."""

    def __init__(self, worker: Worker, **kwargs) -> None:
        self.worker = worker
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, kwargs=kwargs, daemon=True)
        self.thread.start()

    def _run(self, **kwargs) -> None:
        try:
            self.result = self.worker.run(**kwargs)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 30.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not return"
        if self.error is not None:
            raise self.error
        return self.result


def run_async(fn, *args, **kwargs):
    """``async_to_sync(fn)(*args, **kwargs)`` on a thread of its own, and its
    result (or exception). The suite's browser tests leave an event loop on
    the main thread, where ``async_to_sync`` refuses to run."""
    from asgiref.sync import async_to_sync

    out: dict = {}

    def call():
        try:
            out["value"] = async_to_sync(fn)(*args, **kwargs)
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(60)
    if "error" in out:
        raise out["error"]
    return out["value"]


def fetching_reporter(mq: EchoMQ):
    """A ``Reporter`` whose loop always has room for one claim riding a
    completion (token ``t1``, ``t2``...): returns it, the queues it asked
    room for and the ``(queue, token, claimed)`` its claims gave."""
    from echomq_django.runners.reporter import Reporter

    asked, taken = [], []

    def fetch(queue, yields_to=None, last=False):
        asked.append(queue)
        return 1, 5000, f"t{len(asked)}"

    reporter = Reporter(mq, None, lambda *j: None, lambda q: None, lambda: None,
                        fetch=fetch, taken=lambda *got: taken.append(got))  # fmt: skip
    return reporter, asked, taken
