"""Live workers and pumps, and every queue ever used: a runner's heartbeat
lists it while it lives, and ``P:queues`` knows every queue written to.

Heartbeats run on both rigs with a fake clock (``Clock``), so expiry is
asserted by moving time, never by waiting. The SIGKILL test kills a real
process and reads the list at the moment its registration expires.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from echomq_django import EchoMQ, Flow
from echomq_django.protocol import presence, wire
from echomq_django.protocol.presence import MISSED_BEATS, ProcessInfo
from echomq_django.runners import heartbeat
from echomq_django.runners.heartbeat import Heartbeat, known_queues, unknown_queue_warning
from tests.support.jobkit import T0
from tests.support.workerkit import wait_for


def test_a_heartbeat_lists_the_process_with_what_it_said(tmq, clock):
    status = {"jobs_done": 7, "running": 2, "running_jobs": ["orders/a", "orders/b"]}
    hb = Heartbeat(
        tmq, "worker", ["orders", "payments"], interval_s=5, status=lambda: status, concurrency=4
    )
    assert hb.beat() is True
    clock.advance(1000)
    [info] = tmq.presence.live_processes()
    assert info == ProcessInfo(
        id=hb.info.id,
        kind="worker",
        host=hb.info.host,
        pid=os.getpid(),
        queues=["orders", "payments"],
        started_at=T0,
        heartbeat_at=T0,
        expires_at=T0 + 5000 * MISSED_BEATS,
        prefix="emq",
        jobs_done=7,
        running=2,
        running_jobs=["orders/a", "orders/b"],
        concurrency=4,
        version=heartbeat.package_version(),
    )
    assert hb.info.id.startswith(f"{info.host}:{os.getpid()}:")
    ttl = tmq.client.pttl(tmq.keys.process(hb.info.id))
    assert 0 < ttl <= 15000  # Redis drops the key itself when no beat follows


def test_a_process_leaves_the_list_missed_beats_after_its_last(tmq, clock):
    hb = Heartbeat(tmq, "pump", ["orders"], interval_s=2)
    hb.beat()
    clock.advance(2000 * MISSED_BEATS - 1)
    assert [p.id for p in tmq.presence.live_processes()] == [hb.info.id]
    clock.advance(1)
    assert tmq.presence.live_processes() == []
    # its next beat brings it back, with the same id and start time
    hb.beat()
    [info] = tmq.presence.live_processes()
    assert (info.id, info.started_at, info.heartbeat_at) == (hb.info.id, T0, T0 + 6000)


def test_a_clean_stop_removes_the_process_at_once(tmq, clock):
    hb = Heartbeat(tmq, "worker", ["orders"], interval_s=60).start()
    assert [p.kind for p in tmq.presence.live_processes()] == ["worker"]
    hb.stop()
    assert tmq.presence.live_processes() == []
    assert tmq.client.exists(tmq.keys.process(hb.info.id)) == 0
    assert tmq.client.zcard(tmq.keys.processes()) == 0


def test_another_prefix_and_garbled_entries_never_show_up(redis_client, tmq, clock):
    other = EchoMQ(redis_client, prefix="other", clock=clock)
    Heartbeat(other, "worker", ["orders"], interval_s=5).beat()
    assert tmq.presence.live_processes() == []
    assert [p.prefix for p in other.presence.live_processes()] == ["other"]
    # hand-written entries in our own index: another prefix's JSON, garbage, a bad kind
    forged = Heartbeat(other, "worker", ["orders"], interval_s=5).info.as_dict()
    forged.update(expires_at=T0 + 10000)
    c = tmq.client
    for pid, raw in [
        ("x:1:a", json.dumps(forged)),
        ("x:2:b", "not json"),
        ("x:3:c", json.dumps({**forged, "prefix": "emq", "kind": "robot"})),
    ]:
        c.set(tmq.keys.process(pid), raw)
        c.zadd(tmq.keys.processes(), {pid: T0 + 10000})
    assert tmq.presence.live_processes() == []


def test_the_index_is_bounded_and_pruned_by_every_beat(tmq, clock, monkeypatch):
    monkeypatch.setattr(presence, "MAX_PROCESSES", 3)
    beats = [Heartbeat(tmq, "worker", ["orders"], interval_s=1) for _ in range(5)]
    for i, hb in enumerate(beats):
        clock.now = T0 + i  # later beats expire later
        hb.beat()
    index = tmq.client.zrange(tmq.keys.processes(), 0, -1)
    assert [x.decode() for x in index] == [hb.info.id for hb in beats[2:]]
    assert [p.id for p in tmq.presence.live_processes()] == sorted(
        (hb.info.id for hb in beats[2:]), key=lambda i: (int(i.split(":")[1]), i)
    )
    # a beat long after drops every expired id from the index
    clock.now = T0 + 10_000
    fresh = Heartbeat(tmq, "pump", ["orders"], interval_s=1)
    fresh.beat()
    assert [x.decode() for x in tmq.client.zrange(tmq.keys.processes(), 0, -1)] == [fresh.info.id]


def test_the_upkeep_comes_with_the_first_beat_then_one_in_upkeep_every(tmq, clock):
    """Between two upkeeps a beat writes its own key and index entry only:
    a stale id stays in the index (listings skip it) and ``P:served`` keeps
    the time of the last upkeep, until the next upkeep trims and writes."""
    hb = Heartbeat(tmq, "worker", ["orders"], interval_s=1)
    index, served = tmq.keys.processes(), tmq.keys.served()

    def state():
        ids = {x.decode() for x in tmq.client.zrange(index, 0, -1)}
        return "stale" in ids, int(tmq.client.hget(served, "orders"))

    tmq.client.zadd(index, {"stale": T0 - 1})
    hb.beat()
    assert state() == (False, T0)  # the first beat: trimmed, served written
    for i in range(1, presence.UPKEEP_EVERY):
        tmq.client.zadd(index, {"stale": T0 - 1})
        clock.advance(1000)
        hb.beat()
        assert state() == (True, T0), i  # no upkeep
        assert [p.id for p in tmq.presence.live_processes()] == [hb.info.id]
    clock.advance(1000)
    hb.beat()
    assert state() == (False, T0 + 1000 * presence.UPKEEP_EVERY)
    assert hb.beats == presence.UPKEEP_EVERY + 1


def test_bad_heartbeat_arguments_are_refused(tmq):
    with pytest.raises(ValueError, match="kind must be one of worker, pump, got 'robot'"):
        Heartbeat(tmq, "robot", ["orders"])
    with pytest.raises(ValueError, match=r"interval_s must be > 0 \(seconds\), got 0"):
        Heartbeat(tmq, "worker", ["orders"], interval_s=0)
    with pytest.raises(ValueError, match="invalid queue name 'a b'"):
        Heartbeat(tmq, "worker", ["a b"])


KILLED = """
import sys, time, redis
from echomq_django import EchoMQ
from echomq_django.runners.heartbeat import Heartbeat
hb = Heartbeat(EchoMQ(redis.Redis.from_url(sys.argv[1])), "worker", ["orders"], interval_s=0.2)
hb.start()
print(hb.info.id, flush=True)
time.sleep(60)
"""


@pytest.mark.e2e
def test_a_sigkilled_process_leaves_the_list_within_missed_beats(r, redis_server):
    mq = EchoMQ(r, prefix="emq")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED, redis_server], stdout=subprocess.PIPE, text=True
    )
    try:
        pid = proc.stdout.readline().strip()
        wait_for(lambda: any(p.id == pid for p in mq.presence.live_processes()), what="first beat")
        wait_for(
            lambda: (
                mq.presence.live_processes()[0].heartbeat_at
                > mq.presence.live_processes()[0].started_at
            ),
            what="a second beat",
        )
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    [info] = mq.presence.live_processes()
    assert info.expires_at - info.heartbeat_at == 200 * MISSED_BEATS
    assert mq.presence.live_processes(now_ms=info.expires_at - 1) == [info]
    assert mq.presence.live_processes(now_ms=info.expires_at) == []
    assert r.pttl(mq.keys.process(pid)) <= 200 * MISSED_BEATS


# -- P:queues -------------------------------------------------------------------
def test_queues_are_added_once_and_read_back_sorted(tmq):
    assert tmq.presence.register_queues(["orders", "payments"]) == ["orders", "payments"]
    assert tmq.presence.register_queues(["payments", "audit"]) == ["audit"]
    tmq.client.sadd(tmq.keys.queues(), "bad name")  # written by hand: skipped on read
    assert tmq.presence.queues() == ["audit", "orders", "payments"]
    with pytest.raises(ValueError, match="invalid queue name"):
        tmq.presence.register_queues(["ok", "{x}"])
    assert tmq.presence.queues() == ["audit", "orders", "payments"]


def test_the_queue_set_is_bounded(tmq, monkeypatch, caplog):
    monkeypatch.setattr(wire, "MAX_QUEUES", 2)
    assert tmq.presence.register_queues(["a", "b"]) == ["a", "b"]
    assert tmq.presence.register_queues(["c"]) == []
    assert tmq.presence.queues() == ["a", "b"]
    assert "holds 2 queue names (the bound is 2): c not added" in caplog.text


def test_every_write_path_registers_its_queues(tmq):
    tmq.enqueue("mail", "t.leaf", {})
    tmq.add_flow(Flow("reports", "t.parent", {}, children=[Flow("pdf", "t.leaf", {})]))
    assert tmq.presence.queues() == ["mail", "pdf", "reports"]


def test_a_process_adds_a_queue_once_a_minute(tmq, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(wire.time, "monotonic", lambda: now[0])
    tmq.enqueue("mail", "t.leaf", {})
    tmq.client.delete(tmq.keys.queues())  # as a flush would
    tmq.enqueue("mail", "t.leaf", {})
    assert tmq.presence.queues() == []  # noted a moment ago: not added again
    now[0] += wire.REGISTER_EVERY_S
    tmq.enqueue("mail", "t.leaf", {})
    assert tmq.presence.queues() == ["mail"]


def test_known_queues_join_redis_settings_and_live_processes(tmq, clock):
    tmq.presence.register_queues(["audit"])
    Heartbeat(tmq, "worker", ["emails"], interval_s=5).beat()
    settings = ["inventory", "orders", "payments", "validation"]  # testproject's QUEUES
    assert known_queues(tmq) == sorted(["audit", "emails", *settings])
    assert known_queues(tmq, extra=["zz"]) == sorted(["audit", "emails", "zz", *settings])


def test_nothing_known_at_all_is_not_a_typo(tmq, settings):
    settings.ECHOMQ = {**settings.ECHOMQ, "QUEUES": {}}
    assert unknown_queue_warning(tmq, ["bench"]) is None
    tmq.presence.register_queues(["audit"])
    assert unknown_queue_warning(tmq, ["bench"]).startswith("queue bench is not known")


def test_a_worker_on_an_unknown_queue_is_told_the_known_ones(tmq):
    tmq.presence.register_queues(["audit"])
    assert unknown_queue_warning(tmq, ["orders", "audit"]) is None
    assert unknown_queue_warning(tmq, ["oders"]) == (
        "queue oders is not known: no job was ever added to it and ECHOMQ['QUEUES'] does "
        "not name it; known queues: audit, inventory, orders, payments, validation. A typo?"
    )
    assert unknown_queue_warning(tmq, ["x", "y"]).startswith(
        "queues x, y are not known: no job was ever added to them"
    )
