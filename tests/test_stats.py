"""``echomq_stats`` and the stats it reads: counts, ages and the last
minute's throughput per queue, as a table or as JSON.

The library half runs on both rigs with a fake clock, so ages and the
one-minute window are exact; the command runs against the settings'
``EchoMQ`` on the private server, its clock faked the same way.
"""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from echomq_django import conf
from echomq_django.monitoring.stats import SCHEMA, UnknownQueue, collect, duration, render
from echomq_django.runners.heartbeat import Heartbeat
from tests.support.jobkit import T0
from tests.support.workerkit import Clock


def busy(mq, clock) -> Heartbeat:
    """orders: one completed and one dead at T0, one pending since T0, one
    delayed; a live worker on orders. Then the clock moves to T0 + 5 s."""
    for job_id in ("a", "b", "c"):
        mq.enqueue("orders", "t.echo", {"n": job_id}, job_id=job_id, max_attempts=1)
    mq.enqueue("orders", "t.echo", {}, job_id="d", delay_ms=60_000)
    a, b = mq.claim("orders", count=2, lease_ms=30_000)
    mq.complete(a, {"ok": True})
    assert mq.fail(b, "boom") == "dead"
    hb = Heartbeat(mq, "worker", ["orders"], interval_s=5, concurrency=2)
    hb.beat()
    clock.advance(5000)
    return hb


def test_stats_of_a_busy_queue_are_exact(tmq, clock):
    hb = busy(tmq, clock)
    doc = collect(tmq, ["orders"])
    assert doc == {
        "schema": SCHEMA,
        "at": T0 + 5000,
        "prefix": "emq",
        "queues": {
            "orders": {
                "counts": {
                    "pending": 1,
                    "active": 0,
                    "delayed": 1,
                    "completed": 1,
                    "dead": 1,
                    "awaiting_children": 0,
                },
                "oldest_pending_age_s": 5.0,
                "completed_last_minute": 1,
                "dead_last_minute": 1,
                "jobs_per_s": 0.033,
                "outbox": 0,
                "deadletter": 0,
                "paused": False,
                "signals": 0,
                "signals_oldest_age_s": None,
                "signals_deadletter": 0,
                "groups": {},
                "in_settings": True,
                "workers": 1,
                "no_worker_for_s": None,
            }
        },
        "processes": [hb.info.as_dict()],
        "schedule": [],
    }
    assert json.loads(json.dumps(doc)) == doc  # plain JSON types only


def test_the_throughput_window_is_the_last_minute(tmq, clock):
    busy(tmq, clock)
    clock.now = T0 + 59_999
    assert collect(tmq, ["orders"])["queues"]["orders"]["completed_last_minute"] == 1
    clock.now = T0 + 60_000
    entry = collect(tmq, ["orders"])["queues"]["orders"]
    assert (entry["completed_last_minute"], entry["dead_last_minute"], entry["jobs_per_s"]) == (
        0,
        0,
        0.0,
    )


def test_every_known_queue_is_reported_without_names(tmq, clock):
    tmq.presence.register_queues(["audit"])  # in Redis only, not in settings
    doc = collect(tmq)
    assert list(doc["queues"]) == ["audit", "inventory", "orders", "payments", "validation"]
    audit = doc["queues"]["audit"]
    assert audit["in_settings"] is False
    assert audit["counts"] == dict.fromkeys(audit["counts"], 0)
    assert audit["oldest_pending_age_s"] is None


def test_no_worker_for_counts_from_the_first_job_then_the_last_worker(tmq, clock):
    tmq.enqueue("defualt", "t.echo", {})  # a typo: no worker serves it
    clock.advance(7000)
    doc = collect(tmq, ["defualt", "orders"])
    # orders: named in settings, never used, never served: not known since when
    assert [doc["queues"][q]["no_worker_for_s"] for q in ("defualt", "orders")] == [7.0, None]
    hb = Heartbeat(tmq, "worker", ["defualt"], interval_s=5)
    hb.beat()
    assert collect(tmq, ["defualt"])["queues"]["defualt"]["no_worker_for_s"] is None
    clock.advance(2500)
    hb.beat()  # its last beat on the queue
    tmq.presence.leave(hb.info.id, hb.info.queues)
    clock.advance(4000)
    assert collect(tmq, ["defualt"])["queues"]["defualt"]["no_worker_for_s"] == 4.0
    assert "no worker for" in render(collect(tmq, ["defualt"])).splitlines()[0]
    assert render(collect(tmq, ["defualt"])).splitlines()[1].endswith("  4.0 s")


def test_the_served_record_is_bounded(tmq, clock, monkeypatch):
    from echomq_django.protocol import presence

    monkeypatch.setattr(presence, "MAX_SERVED", 3)
    tmq.presence.register_queues(["q1", "q2", "q3", "q4"])
    assert tmq.client.hlen(tmq.keys.served()) == 4
    Heartbeat(tmq, "worker", ["w1"], interval_s=5).beat()  # 5 > 3: starts afresh
    assert tmq.client.hgetall(tmq.keys.served()) == {b"w1": str(T0).encode()}


def test_an_unknown_queue_is_one_clear_error(tmq):
    tmq.presence.register_queues(["audit"])
    with pytest.raises(UnknownQueue) as err:
        collect(tmq, ["orders", "oders"])
    assert str(err.value) == (
        "unknown queue 'oders': no job, setting or live process uses it; known queues: "
        "audit, inventory, orders, payments, validation"
    )
    with pytest.raises(ValueError, match="invalid queue name 'a b'"):
        collect(tmq, ["a b"])


def test_durations_read_in_words():
    assert [duration(s) for s in (None, 0, 4.25, 42, 65, 3600 * 2 + 600, 86400 * 3 + 7200)] == [
        "-",
        "0.0 s",
        "4.2 s",
        "42 s",
        "1 min 5 s",
        "2 h 10 min",
        "3 d 2 h",
    ]


# -- the command ------------------------------------------------------------------
@pytest.fixture
def emq(r):
    """The settings' ``EchoMQ`` on the private server, on a fake clock."""
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Clock()
    yield mq
    conf.reset()


def run(*args) -> str:
    out = io.StringIO()
    call_command("echomq_stats", *args, stdout=out)
    return out.getvalue()


def test_the_command_prints_a_table(emq):
    hb = busy(emq, emq.clock)
    text = run("orders")
    assert text.splitlines()[:2] == [
        "queue   pending  active  delayed  awaiting  completed  dead  oldest pending  "
        "jobs/s (1 min)  outbox  dead-letters  signals  paused  workers  no worker for",
        "orders        1       0        1         0          1     1           5.0 s"
        "            0.03       0             0        0      no        1              -",
    ]
    assert text.splitlines()[3] == "live workers and pumps: 1"
    assert text.splitlines()[5].split() == [
        "worker",
        hb.info.host,
        str(hb.info.pid),
        "orders",
        "5.0",
        "s",
        "0",
        "0",
        "5.0",
        "s",
        "ago",
        hb.info.version,
    ]
    assert text == render(collect(emq, ["orders"])) + "\n"


def test_the_command_prints_the_json_document(emq):
    busy(emq, emq.clock)
    assert json.loads(run("--json")) == collect(emq)
    lines = run("orders", "--json", "--watch", "0.01", "--count", "2").splitlines()
    assert [json.loads(line)["queues"]["orders"]["counts"]["dead"] for line in lines] == [1, 1]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["nope"],
            "echomq_stats: unknown queue 'nope': no job, setting or live process uses it; "
            "known queues: inventory, orders, payments, validation",
        ),
        (
            ["a b"],
            "echomq_stats: invalid queue name 'a b': a queue name is 1-64 characters from "
            "A-Z a-z 0-9 _ . -",
        ),
        (["--watch", "0"], "echomq_stats: --watch must be > 0 seconds, got 0.0"),
        (["--watch", "1", "--count", "0"], "echomq_stats: --count must be >= 1, got 0"),
        (["--watch", "1e300"], "echomq_stats: --watch must be at most 86400 s (a day), got 1e+300"),
        (["--count", "2"], "echomq_stats: --count counts the refreshes of --watch: give --watch S"),
    ],
)
def test_bad_command_input_is_one_line(emq, args, message):
    with pytest.raises(CommandError) as err:
        run(*args)
    assert str(err.value) == message


def test_an_unreachable_redis_is_one_line(monkeypatch):
    from tests.support.rigs import free_port

    port = free_port()
    monkeypatch.setenv("ECHOMQ_URL", f"redis://127.0.0.1:{port}/0")
    conf.reset()
    try:
        with pytest.raises(CommandError) as err:
            run("orders")
    finally:
        conf.reset()
    assert str(err.value).startswith(
        f"echomq_stats: Redis is unreachable at redis://127.0.0.1:{port}/0"
    )
    assert "\n" not in str(err.value)


def test_the_bulk_read_answers_what_each_queue_read_answers(tmq, clock):
    """``mq.probes.overview`` reads every queue at once (the dashboard's
    and ``collect``'s one bulk read): the same counts, pending head (a
    priority above 0 first), pause and minute rows as the reads of one
    queue at a time."""
    busy(tmq, clock)
    tmq.enqueue("payments", "t.echo", 1, job_id="low")
    clock.advance(1000)
    tmq.enqueue("payments", "t.echo", 2, job_id="urgent", priority=5)
    tmq.pause("payments")
    clock.advance(2000)
    names = ["orders", "payments", "audit"]
    now_minute, got = tmq.probes.overview(names, minutes=3)
    assert list(got) == names
    assert {q: got[q]["counts"] for q in names} == {q: tmq.counts(q) for q in names}
    assert {q: got[q]["head_since"] for q in names} == {
        "orders": T0,  # c, pending since T0
        "payments": T0 + 5000,  # low: urgent jumps it, yet it has waited longer
        "audit": None,
    }
    assert {q: got[q]["paused"] for q in names} == {
        "orders": False,
        "payments": True,
        "audit": False,
    }
    assert got["orders"]["finished"] == (1, 1)
    assert got["orders"]["signals"] == tmq.signal_events.backlog("orders")
    assert (now_minute, {q: got[q]["minutes"] for q in names}) == tmq.probes.minute_counts(names, 3)
    assert sum(row["added"] for row in got["payments"]["minutes"]) == 2
    entry = collect(tmq, ["payments"])["queues"]["payments"]
    assert (entry["oldest_pending_age_s"], entry["paused"]) == (3.0, True)


@pytest.mark.django_db
def test_a_fair_queues_grouped_jobs_count_in_the_oldest_pending_age(tmq, clock):
    """A fair queue's grouped jobs wait in their groups' lists, not in its
    ``pending``: the oldest pending age is the longest wait among every
    head, the queue's and each group's, in the stats, the metrics' source,
    the admin's live summary and the mirror alike."""
    from types import SimpleNamespace

    from echomq_django.admin.pages import queue_summary
    from echomq_django.models import MirroredQueue
    from echomq_django.monitoring.mirror import mirror_queue

    tmq.enqueue("fair", "t.echo", 1, job_id="g1", group="cust-1")
    clock.advance(1000)
    tmq.enqueue("fair", "t.echo", 2, job_id="g2", group="cust-2", priority=3)
    clock.advance(3000)
    assert tmq.probes.heads_since(["fair", "idle"]) == {"fair": T0, "idle": None}
    assert collect(tmq, ["fair"])["queues"]["fair"]["oldest_pending_age_s"] == 4.0
    assert queue_summary(tmq, SimpleNamespace(queue="fair"))["oldest_pending_s"] == 4.0
    mirror_queue(tmq, "fair", full=True)
    assert MirroredQueue.objects.get(queue="fair").oldest_pending_age_s == 4.0
    tmq.enqueue("fair", "t.echo", 3, job_id="plain")  # the queue's own head is younger
    clock.advance(1000)
    assert tmq.probes.heads_since(["fair"]) == {"fair": T0}
    assert sorted(j.id for j in tmq.claim("fair", count=3)) == ["g1", "g2", "plain"]
    assert tmq.probes.heads_since(["fair"]) == {"fair": None}
