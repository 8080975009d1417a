"""Workers and pumps as an operator sees them: they list themselves while they
run, count their jobs in Prometheus metrics, and warn about a queue known
nowhere (``runworker --metrics-port`` is in ``tests/e2e/test_runworker.py``)."""

from __future__ import annotations

import threading
import uuid

import prometheus_client

from echomq_django import Worker
from echomq_django.monitoring.metrics import process_metrics
from echomq_django.runners.pump import Pump
from tests.support.workerapp.jobs import GATES
from tests.support.workerkit import Background, wait_for


def test_a_running_worker_is_listed_with_the_jobs_it_holds(mq):
    name = f"listed-{uuid.uuid4().hex}"
    gate = GATES.setdefault(name, threading.Event())
    mq.enqueue("ops", "t.gate", name, job_id="held")
    worker = Worker(["ops"], concurrency=2, mq=mq, beat_s=0.05, poll_interval=0.05)
    bg = Background(worker, burst=True)
    try:
        wait_for(
            lambda: [p.running for p in mq.presence.live_processes()] == [1],
            what="a beat with the job held",
        )
        [info] = mq.presence.live_processes()
        assert (info.kind, info.queues, info.running_jobs, info.concurrency, info.jobs_done) == (
            "worker",
            ["ops"],
            ["ops/held"],
            2,
            0,
        )
    finally:
        gate.set()
    assert bg.join() == 1
    assert mq.presence.live_processes() == []  # a clean stop leaves at once


def test_a_pump_is_listed_while_it_runs(mq):
    seen = []
    pump = Pump(["ops"], mq=mq)
    pump.run(once=True, on_sweep=lambda reports: seen.append(mq.presence.live_processes()))
    [[info]] = seen
    assert (info.kind, info.queues, info.concurrency) == ("pump", ["ops"], 0)
    assert mq.presence.live_processes() == []


def test_a_worker_counts_its_jobs_in_the_metrics(mq):
    value = prometheus_client.REGISTRY.get_sample_value

    def sample(name, job_name):
        return value(name, {"queue": "metered", "name": job_name}) or 0

    before = (
        sample("echomq_jobs_completed_total", "t.echo"),
        sample("echomq_jobs_dead_total", "t.fail"),
        sample("echomq_handler_duration_seconds_count", "t.echo"),
    )
    mq.enqueue("metered", "t.echo", {"x": 1})
    mq.enqueue("metered", "t.echo", {"x": 2})
    mq.enqueue("metered", "t.fail", "boom", max_attempts=1)
    worker = Worker(["metered"], concurrency=2, mq=mq, metrics=process_metrics(), register=False)
    assert worker.run(burst=True) == 3
    after = (
        sample("echomq_jobs_completed_total", "t.echo"),
        sample("echomq_jobs_dead_total", "t.fail"),
        sample("echomq_handler_duration_seconds_count", "t.echo"),
    )
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 1, 2]


def test_a_worker_on_a_queue_known_nowhere_names_the_known_ones(mq, caplog):
    mq.enqueue("audit", "t.echo", {})
    Worker(["adit"], mq=mq, register=False).run(burst=True)
    assert (
        "queue adit is not known: no job was ever added to it and ECHOMQ['QUEUES'] does not "
        "name it; known queues: audit, inventory, orders, payments, validation. A typo?"
    ) in caplog.text
    caplog.clear()
    Worker(["audit"], mq=mq, register=False).run(burst=True)
    assert "is not known" not in caplog.text
    Pump(["adit"], mq=mq, register=False).run(once=True)  # the pump says so too
    assert "queue adit is not known: no job was ever added to it" in caplog.text
