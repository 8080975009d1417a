"""The Redis-outage backoff, one policy for both runners: the pump
waits an outage out inside ``Pump.run`` as the worker does inside
``Worker.run``, with the same log line."""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ
from echomq_django.runners.outage import BACKOFF_MAX_S, BACKOFF_START_S, Outage
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


def test_the_backoff_doubles_to_its_cap_and_resets_on_recovery(caplog):
    log = logging.getLogger("echomq_django.test_outage")
    outage = Outage(redis.Redis(port=1), log)
    err = redis.exceptions.ConnectionError("refused")
    delays = [outage.failed(err) for _ in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, BACKOFF_MAX_S, BACKOFF_MAX_S]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=log.name):
        outage.ok()
        outage.ok()  # logged once
    assert [r.getMessage() for r in caplog.records] == [
        "Redis reachable again at redis://localhost:1/0"
    ]
    assert outage.failed(err) == BACKOFF_START_S


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
