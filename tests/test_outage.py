"""The Redis-outage backoff, one policy for both runners: the pump
waits an outage out inside ``Pump.run`` as the worker does inside
``Worker.run``, with the same log line."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ
from echomq_django.runners.outage import (
    BACKOFF_MAX_S,
    BACKOFF_START_S,
    Outage,
    StartSignals,
    reach_redis_at_start,
)
from echomq_django.runners.pump import Pump


def test_pump_run_waits_out_an_outage_instead_of_raising(caplog):
    down = redis.Redis(port=1, retry=Retry(NoBackoff(), 0))  # refused at once, no retries
    pump = Pump(["q"], mq=EchoMQ(down))
    with caplog.at_level(logging.WARNING, logger="echomq_django.pump"):
        pump.run(should_stop=lambda: True)  # stop during the first backoff
    [record] = caplog.records
    assert record.getMessage().startswith("Redis unreachable at redis://localhost:1/0 (")
    assert record.getMessage().endswith(f"retrying in {BACKOFF_START_S:.1f}s")


def test_stop_ends_the_pumps_outage_backoff_at_once():
    down = redis.Redis(port=1, retry=Retry(NoBackoff(), 0))
    pump = Pump(["q"], mq=EchoMQ(down), register=False)
    thread = threading.Thread(target=pump.run, daemon=True)
    thread.start()
    time.sleep(0.2)  # in the first backoff (0.5 s)
    asked = time.monotonic()
    pump.stop()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - asked < 0.25  # the backoff was not waited out


def test_the_backoff_doubles_to_its_cap_and_resets_on_recovery(caplog, monkeypatch):
    """Tries at 0.5, 1, then every 2 s, so a Redis that comes back is heard
    within 2 s; the log says each try up to the first at the cap, then one
    line per 30 s with how long it has lasted."""
    from echomq_django.runners import outage as module

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    log = logging.getLogger("echomq_django.test_outage")
    outage = Outage(redis.Redis(port=1), log)
    err = redis.exceptions.ConnectionError("refused")
    with caplog.at_level(logging.WARNING, logger=log.name):
        delays = []
        for _ in range(40):  # 0.5 + 1 + 38 * 2 = 77.5 s of outage
            delays.append(outage.failed(err))
            now[0] += delays[-1]
    assert BACKOFF_MAX_S == 2.0
    assert delays == [0.5, 1.0] + [BACKOFF_MAX_S] * 38
    said = [r.getMessage() for r in caplog.records]
    assert said[:3] == [
        f"Redis unreachable at redis://localhost:1/0 (refused), retrying in {s}s"
        for s in ("0.5", "1.0", "2.0")
    ]
    # the third line at 1.5 s; then at the first try 30 s after it and 30 s after that
    assert said[3:] == [
        f"Redis still unreachable at redis://localhost:1/0 after {s}s (refused), "
        "retrying every 2.0s"
        for s in (32, 62)
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=log.name):
        outage.ok()
        outage.ok()  # logged once
    assert [r.getMessage() for r in caplog.records] == [
        "Redis reachable again at redis://localhost:1/0"
    ]
    assert outage.failed(err) == BACKOFF_START_S


def test_a_reporters_tries_are_at_most_two_seconds_apart(r, monkeypatch):
    """A worker's reporter waits out an outage with the runners' cap (BACKOFF_MAX_S, 2 s):
    the loop claims nothing while it waits, so a long wait would idle the worker after Redis
    is back (docs/explanation/reliability.md#unreported-jobs-keep-their-leases)."""
    from echomq_django import Worker
    from echomq_django.runners import reporter

    made = []
    monkeypatch.setattr(
        reporter, "Outage", lambda *a, **k: made.append(Outage(*a, **k)) or made[-1]
    )
    Worker(["q"], mq=EchoMQ(r, prefix="emq")).run(burst=True)
    err = redis.exceptions.ConnectionError("refused")
    assert [made[0].failed(err) for _ in range(5)] == [0.5, 1.0, 2.0, 2.0, 2.0]
    assert BACKOFF_MAX_S == 2.0


def test_a_worker_in_an_outage_backs_off_and_says_it_recovered_once(caplog):
    """Redis stops answering under an idle worker (its queues drained, so a
    retry of the claiming loop sends nothing): each retry asks Redis first,
    the wait doubles, and the recovery is logged once, when Redis answers
    again, not after every quiet retry."""
    import signal

    from echomq_django import Worker
    from echomq_django.testing.redis_server import start_server
    from tests.support.workerkit import wait_for

    server = start_server()
    client = redis.Redis.from_url(
        server.url, socket_timeout=0.3, socket_connect_timeout=0.3, retry=Retry(NoBackoff(), 0)
    )
    # timers every 2 s: longer than the first backoff, so a retry finds nothing to send
    worker = Worker(["q"], mq=EchoMQ(client), sweep_interval=2.0, register=False)
    thread = threading.Thread(target=worker.run, daemon=True)

    def lines() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "echomq_django.worker"]

    try:
        with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
            thread.start()
            wait_for(lambda: worker.waiting, what="an idle worker")
            server.proc.send_signal(signal.SIGSTOP)
            try:
                wait_for(lambda: sum("retrying in" in m for m in lines()) >= 3, what="3 tries")
                down = lines()
            finally:
                server.proc.send_signal(signal.SIGCONT)
            wait_for(lambda: any("reachable again" in m for m in lines()), what="the recovery")
    finally:
        worker.stop()
        thread.join(10)
        server.stop()
    assert not any("reachable again" in m for m in down), down
    delays = [float(m.rsplit("retrying in ", 1)[1].rstrip("s")) for m in down if "retrying" in m]
    assert delays[:3] == [BACKOFF_START_S, 2 * BACKOFF_START_S, 4 * BACKOFF_START_S], down
    assert sum("reachable again" in m for m in lines()) == 1


@pytest.fixture
def start_signals(caplog):
    """A ``StartSignals`` on this process, the handlers it replaced put back after."""
    caplog.set_level(logging.WARNING, logger="echomq_django.test_outage")
    signals = StartSignals(logging.getLogger("echomq_django.test_outage"))
    try:
        yield signals
    finally:
        signals.close()


def test_a_sigterm_during_a_try_that_reaches_redis_stops_the_start(r, start_signals, caplog):
    """The signal lands while the first PING waits on a paused server: the
    try succeeds, and the start still stops (it once ran on, deaf to it)."""
    r.client_pause(600, all=True)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    log = logging.getLogger("echomq_django.test_outage")
    assert reach_redis_at_start(True, log, start_signals.stopped) is None
    assert [rec.getMessage() for rec in caplog.records] == ["SIGTERM while starting: stopping"]


def test_a_signal_before_hand_over_is_kept_and_later_ones_reach_the_runner(start_signals):
    got = []
    os.kill(os.getpid(), signal.SIGINT)
    assert start_signals.hand_over(lambda signum, frame: got.append(signum)) is True
    os.kill(os.getpid(), signal.SIGTERM)
    assert got == [signal.SIGTERM]


def test_hand_over_without_a_signal_says_start(r, start_signals):
    log = logging.getLogger("echomq_django.test_outage")
    assert reach_redis_at_start(True, log, start_signals.stopped) is not None
    assert start_signals.hand_over(lambda signum, frame: None) is False


def test_pump_run_on_the_main_thread_stops_while_signals_land(r):
    """Signals handled on the main thread during the pump's waits (here a
    SIGUSR1 handler that takes 2 ms, as a log line can under load, 3 ms
    apart) do not hold it: a ``should_stop`` that came true is seen. A
    SimpleQueue.get(timeout) there blocked for good on CPython before 3.13
    when a handler ran past the wait's end, so runpump once missed its
    SIGTERM."""
    before = signal.signal(signal.SIGUSR1, lambda signum, frame: time.sleep(0.002))
    pump = Pump(["q"], mq=EchoMQ(r, prefix="emq"), register=False)
    asked, rescued = threading.Event(), threading.Event()

    def signals_then_stop() -> None:
        time.sleep(0.3)
        for _ in range(200):
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.003)
        asked.set()
        if not stopped.wait(10):  # still held: free the test, and fail it below
            rescued.set()
            pump.stop()

    stopped = threading.Event()
    threading.Thread(target=signals_then_stop, daemon=True).start()
    try:
        pump.run(interval=0.1, should_stop=asked.is_set)
    finally:
        stopped.set()
        signal.signal(signal.SIGUSR1, before)
    assert (asked.is_set(), rescued.is_set()) == (True, False)


def test_a_tls_client_is_described_with_its_scheme():
    """The outage lines name a TLS client's server ``rediss://`` (it said ``redis://``)."""
    from echomq_django.protocol.errors import describe

    assert describe(redis.Redis(port=1, ssl=True)) == "rediss://localhost:1/0"
    assert describe(redis.Redis(port=1)) == "redis://localhost:1/0"
