"""The commit outbox (echomq_django.commit_outbox): nothing lost when Redis is
down at the commit, on SQLite and on PostgreSQL (when one answers: see the report header):
Redis down at commit -> the job runs once after Redis returns; rollback ->
nothing anywhere; a crash between push and delete -> one run; two drainers
-> each row pushed once."""

from __future__ import annotations

import logging
import threading

import pytest
import redis
from django.db import connections, transaction
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ, Flow, JobState, RedisUnavailable
from echomq_django import commit_outbox as outbox
from echomq_django.models import OutboxEntry
from tests.support import rigs
from tests.support.fixtures import database_params
from tests.support.workerkit import burst, wait_for

ALIASES = database_params(sqlite_file=True)
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


class Rollback(Exception):
    pass


@pytest.fixture(params=ALIASES)
def db(request) -> str:
    return request.param


@pytest.fixture
def mq(r) -> EchoMQ:
    return EchoMQ(r, prefix="emq")


def down_mq() -> EchoMQ:
    """An EchoMQ on a loopback port nothing listens on: every call is a
    connection error at once (no retries)."""
    client = redis.Redis(
        port=rigs.free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0)
    )
    return EchoMQ(client, prefix="emq")


def rows(db: str) -> list[tuple[str, str, str]]:
    return list(OutboxEntry.objects.using(db).values_list("kind", "job_id", "error"))


def test_a_commit_pushes_at_once_and_deletes_the_row(db, mq):
    with transaction.atomic(using=db):
        outbox.write_job("q", "t.echo", {"n": 1}, "j1", {"max_attempts": 2}, using=db, mq=mq)
        outbox.write_flow(
            Flow("q", "t.sum_children", job_id="p", children=[Flow("q", "t.echo", 2, job_id="c")]),
            using=db,
            mq=mq,
        )
        assert [r[:2] for r in rows(db)] == [("job", "j1"), ("flow", "p")]
        assert mq.client.keys("*") == []
    assert rows(db) == []
    job = mq.get_job("q", "j1")
    assert (job.state, job.payload, job.max_attempts) == (JobState.PENDING, {"n": 1}, 2)
    assert mq.get_job("q", "p").state is JobState.AWAITING_CHILDREN
    assert mq.job_ids("q", "pending") == ["j1", "c"]


def test_a_rollback_leaves_nothing_anywhere(db, mq):
    with pytest.raises(Rollback), transaction.atomic(using=db):
        outbox.write_job("q", "t.echo", 1, "j1", {}, using=db, mq=mq)
        outbox.write_flow(Flow("q", "t.echo", job_id="p"), using=db, mq=mq)
        raise Rollback
    assert rows(db) == [] and mq.client.keys("*") == []


def test_redis_down_at_commit_runs_once_after_it_returns(db, mq, caplog):
    down = down_mq()
    with caplog.at_level(logging.WARNING, logger="echomq_django.commit_outbox"):
        with transaction.atomic(using=db):
            outbox.write_job("q", "t.echo", {"n": 1}, "j1", {}, using=db, mq=down)
            outbox.write_flow(
                Flow("q", "t.sum_children", job_id="p", children=[Flow("q", "t.echo", 2)]),
                using=db,
                mq=down,
            )
    # the commit stood; both rows wait, each with its failed try counted
    assert rows(db) == [("job", "j1", ""), ("flow", "p", "")]
    assert list(OutboxEntry.objects.using(db).values_list("tries", flat=True)) == [1, 1]
    assert len([r for r in caplog.records if "stays in the commit outbox" in r.message]) == 2
    with pytest.raises(RedisUnavailable):
        outbox.drain(down, using=db)
    assert outbox.pending(using=db) == 2
    # Redis is back: the drain pushes both, oldest first, once
    assert outbox.drain(mq, using=db) == 2
    assert rows(db) == [] and outbox.drain(mq, using=db) == 0
    assert mq.job_ids("q", "pending")[0] == "j1"
    _, processed = burst(mq, ["q"])
    assert processed == 3
    job = mq.get_job("q", "j1")
    assert (job.state, job.attempts, job.result) == (JobState.COMPLETED, 1, {"n": 1})
    assert mq.get_job("q", "p").result == 2


def test_a_crash_between_push_and_delete_runs_once(db, mq):
    with transaction.atomic(using=db):
        outbox.write_job("q", "t.echo", 7, "j1", {}, using=db, mq=down_mq())
        outbox.write_flow(
            Flow("q", "t.sum_children", job_id="p", children=[Flow("q", "t.echo", 2, job_id="c")]),
            using=db,
            mq=down_mq(),
        )
    # a drainer pushed both rows, then died before deleting them
    for entry in OutboxEntry.objects.using(db).order_by("id"):
        outbox.push(mq, entry)
    assert outbox.drain(mq, using=db) == 2  # they count as landed, and go
    assert rows(db) == []
    _, processed = burst(mq, ["q"])
    assert processed == 3
    assert [mq.get_job("q", i).attempts for i in ("j1", "c", "p")] == [1, 1, 1]


def test_a_row_redis_refuses_is_kept_and_skipped(db, mq, caplog):
    mq.enqueue("q", "t.other", 1, job_id="taken")
    with caplog.at_level(logging.ERROR, logger="echomq_django.commit_outbox"):
        with transaction.atomic(using=db):
            outbox.write_job("q", "t.echo", 1, "taken", {}, using=db, mq=mq)
            outbox.write_job("q", "t.echo", 2, "free", {}, using=db, mq=mq)
    [(kind, job_id, error)] = rows(db)
    assert (kind, job_id) == ("job", "taken")
    assert error.startswith("DuplicateJob: ")
    assert outbox.pending(using=db) == 0 and outbox.drain(mq, using=db) == 0
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    assert mq.get_job("q", "free").payload == 2


# Not on the suite's in-memory SQLite: it shares one cache between threads,
# so a second writer fails at once instead of waiting (a setup no deployment
# runs two drainers on); file SQLite and PostgreSQL are what users run.
@pytest.mark.parametrize("db", [a for a in ALIASES if a.id != "sqlite"], indirect=True)
def test_two_drainers_push_each_row_once(db, mq):
    n = 150
    down = down_mq()
    with transaction.atomic(using=db):
        for i in range(n):
            outbox.write_job("q", "t.echo", i, f"j{i}", {}, using=db, mq=down)
    calls: list[str] = []
    lock = threading.Lock()
    real = mq.enqueue

    def counting(queue, name, payload, **kwargs):
        with lock:
            calls.append(kwargs["job_id"])
        return real(queue, name, payload, **kwargs)

    mq.enqueue = counting
    counts, errors = [], []

    def drainer():
        try:
            counts.append(outbox.drain(mq, using=db))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=drainer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sorted(calls) == sorted(f"j{i}" for i in range(n))  # each pushed once
    assert sum(counts) == n and rows(db) == []
    assert len(mq.job_ids("q", "pending")) == n


def test_tables_missing_is_seen(db):
    assert outbox.tables_missing(db) == ""
    with connections[db].schema_editor() as editor:
        editor.delete_model(OutboxEntry)
    try:
        assert outbox.tables_missing(db) == (
            f"echomq_django's tables are missing from database {db!r}: run ./manage.py migrate"
        )
    finally:
        with connections[db].schema_editor() as editor:
            editor.create_model(OutboxEntry)


def test_flow_rows_keep_every_field():
    flow = Flow(
        "q",
        "t.sum_children",
        {"a": 1},
        job_id="p",
        max_attempts=2,
        children=[Flow("r", "t.echo", 2, job_id="c", ignore_dependency_on_failure=True)],
    )
    data = outbox.flow_to_dict(flow)
    assert data == {
        "queue": "q",
        "name": "t.sum_children",
        "payload": {"a": 1},
        "job_id": "p",
        "max_attempts": 2,
        "children": [
            {
                "queue": "r",
                "name": "t.echo",
                "payload": 2,
                "job_id": "c",
                "ignore_dependency_on_failure": True,
            }
        ],
    }
    assert outbox.flow_from_dict(data) == flow


def test_the_drainer_thread_pushes_what_waits(db, mq):
    with transaction.atomic(using=db):
        for i in range(3):
            outbox.write_job("q", "t.echo", i, f"j{i}", {}, using=db, mq=down_mq())
    drainer = outbox.Drainer(mq, interval_s=0.05, using=db)
    drainer.start()
    try:
        # (polls the drainer, not the table: the suite's in-memory SQLite
        # refuses a read beside another thread's write instead of waiting)
        wait_for(lambda: drainer.pushed == 3, what="the outbox drained")
    finally:
        drainer.stop()
    assert outbox.pending(using=db) == 0
    assert mq.job_ids("q", "pending") == ["j0", "j1", "j2"]
