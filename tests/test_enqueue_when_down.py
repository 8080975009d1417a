"""``ECHOMQ["ENQUEUE_WHEN_DOWN"]``: with ``"outbox"``, a plain ``enqueue``,
``enqueue_many`` or ``add_flow`` outside a transaction while Redis is away
writes the commit outbox row and returns its ids; a drainer pushes it
once Redis answers. ``"raise"`` (the default) raises as before; inside
``atomic()`` nothing changes; bad input is refused before any row is
written. On SQLite and on PostgreSQL (when one answers at
``ECHOMQ_TEST_PG``)."""

from __future__ import annotations

import logging

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings

import echomq_django as emq
from echomq_django import EchoMQ, Flow, JobState, PayloadError, RedisUnavailable, conf
from echomq_django import commit_outbox as outbox
from echomq_django.checks import check_settings
from echomq_django.models import OutboxEntry
from tests.support.fixtures import database_params
from tests.support.rigs import free_port

pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")

ALIASES = database_params()


@pytest.fixture(params=ALIASES)
def db(request) -> str:
    return request.param


def _settings(url: str, when_down: str | None) -> dict:
    cfg = {"URL": url, "PREFIX": "emq", "OPTIONS": {"socket_connect_timeout": 0.2}}
    if when_down is not None:
        cfg["ENQUEUE_WHEN_DOWN"] = when_down
    return cfg


@pytest.fixture
def down(monkeypatch):
    """Settings on a loopback port nothing listens on, ``ENQUEUE_WHEN_DOWN``
    as the test asks; yields a function that applies them."""
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    url = f"redis://127.0.0.1:{free_port()}/0"
    overrides = []

    def apply(when_down: str | None = "outbox", to: str = url):
        o = override_settings(ECHOMQ=_settings(to, when_down))
        o.enable()
        overrides.append(o)
        conf.reset()

    yield apply
    for o in reversed(overrides):
        o.disable()
    conf.reset()


def rows(db: str) -> list[tuple[str, str, str, str]]:
    return list(OutboxEntry.objects.using(db).values_list("kind", "queue", "job_id", "error"))


def test_outbox_writes_the_row_and_a_drain_pushes_it_when_redis_is_back(
    db, down, r, redis_server, caplog
):
    down("outbox")
    with caplog.at_level(logging.WARNING, logger="echomq_django.commit_outbox"):
        job_id = emq.enqueue("q", "t.echo", {"n": 1}, job_id="j1", max_attempts=2, using=db)
        [many1, many2] = emq.enqueue_many("q", [("t.echo", 2), ("t.echo", 3)], using=db)
        ref = emq.add_flow(
            Flow("q", "t.sum_children", children=[Flow("q", "t.echo", 4, job_id="c")]), using=db
        )
    assert job_id == "j1"
    assert rows(db) == [
        ("job", "q", "j1", ""),
        ("job", "q", many1, ""),
        ("job", "q", many2, ""),
        ("flow", "q", ref.parent_id, ""),
    ]
    assert ref.child_ids == ["c"]
    said = [r.getMessage().split("; ", 1) for r in caplog.records]
    assert all(m[0].startswith("Redis is unreachable at redis://127.0.0.1:") for m in said)
    assert [m[1] for m in said] == [
        f"{what} written to the commit outbox (ENQUEUE_WHEN_DOWN='outbox')"
        for what in ("job q/j1", "2 jobs of q", f"flow q/{ref.parent_id}")
    ]
    mq = EchoMQ(r, prefix="emq")
    assert outbox.drain(mq, using=db) == 4  # Redis is back: the pump's or the worker's drain
    assert rows(db) == []
    job = mq.get_job("q", "j1")
    assert (job.state, job.payload, job.max_attempts) == (JobState.PENDING, {"n": 1}, 2)
    assert mq.job_ids("q", "pending") == ["j1", many1, many2, "c"]
    assert mq.get_job("q", ref.parent_id).state is JobState.AWAITING_CHILDREN


def test_raise_is_the_default_and_writes_nothing(db, down):
    down(None)
    with pytest.raises(RedisUnavailable, match="Redis is unreachable at redis://127.0.0.1:"):
        emq.enqueue("q", "t.echo", 1, using=db)
    with pytest.raises(RedisUnavailable):
        emq.add_flow(Flow("q", "t.echo"), using=db)
    assert rows(db) == []


def test_an_explicit_on_commit_false_still_raises(db, down):
    down("outbox")
    with pytest.raises(RedisUnavailable):
        emq.enqueue("q", "t.echo", 1, on_commit=False, using=db)
    assert rows(db) == []


def test_bad_input_is_refused_before_any_row(db, down, caplog):
    down("outbox")
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        emq.enqueue("q", "t.echo", {"x": object()}, using=db)
    with pytest.raises(ValueError, match="queue name"):
        emq.enqueue("bad queue", "t.echo", 1, using=db)
    with pytest.raises(ValueError, match="invalid job name"):
        emq.enqueue("q", "", 1, using=db)
    with pytest.raises(ValueError):
        emq.add_flow(Flow("q", "t.echo", children=[Flow("q", "")]), using=db)
    assert rows(db) == []
    assert not [r for r in caplog.records if "outbox" in r.getMessage()]


def test_redis_up_goes_straight_to_redis(db, down, r, redis_server):
    down("outbox", to=redis_server)
    job_id = emq.enqueue("q", "t.echo", 1, using=db)
    assert rows(db) == []
    assert EchoMQ(r, prefix="emq").get_job("q", job_id).state is JobState.PENDING


def test_a_bad_value_is_a_check_error_and_refused_at_use(down):
    down("sometimes")
    [error] = [e for e in check_settings() if e.id == "echomq_django.E090"]
    assert error.msg == (
        "ECHOMQ ENQUEUE_WHEN_DOWN must be one of 'raise', 'outbox', got 'sometimes'"
    )
    with pytest.raises(ImproperlyConfigured, match="E090"):
        emq.enqueue("q", "t.echo", 1)


def test_a_cluster_no_node_of_which_answers_still_takes_outbox_rows(db, down, monkeypatch):
    """``get_mq()`` cannot be built (RedisCluster reads its slot map as it is
    built): the add is checked and written all the same, in a transaction
    and, with ``"outbox"``, outside one."""
    down("outbox")
    cfg = {**settings.ECHOMQ, "CLUSTER": True}
    with override_settings(ECHOMQ=cfg):
        conf.reset()
        hooks = []
        with transaction.atomic(using=db):
            emq.enqueue("q", "t.echo", 1, job_id="in-tx", using=db)
            transaction.on_commit(lambda: hooks.append("mine"), using=db)
        assert hooks == ["mine"]
        assert emq.enqueue("q", "t.echo", 2, job_id="no-tx", using=db) == "no-tx"
        with pytest.raises(PayloadError):
            emq.enqueue("q", "t.echo", {"x": object()}, using=db)
        conf.reset()
    assert rows(db) == [("job", "q", "in-tx", ""), ("job", "q", "no-tx", "")]
