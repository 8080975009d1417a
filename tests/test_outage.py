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
