"""Django's rule for a request's database connections around each job on a
handler thread (docs/howto/deploy.md#database-connections): closed when
past their ``CONN_MAX_AGE`` (or unusable) after the job and before the
next, the call before a job skipped when it could close nothing. On a file
SQLite database and on PostgreSQL (an in-memory SQLite connection is never
closed by Django)."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from echomq_django.runners import pool
from tests.support.fixtures import database_params

ALIASES = [p for p in database_params(sqlite_file=True) if p.values[0] != "default"]
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")


@pytest.fixture(params=ALIASES)
def alias(request) -> str:
    return request.param


def on_a_thread(fn):
    """Run ``fn`` on a fresh thread (its own connections, as a handler
    thread's); re-raise what it raised."""
    out: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test
            out.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


@pytest.fixture
def calls(monkeypatch) -> list[str]:
    """The thread's calls of ``close_old_connections`` made by ``before()``."""
    seen: list[str] = []
    real = pool.close_old_connections

    def recorded():
        seen.append(threading.current_thread().name)
        real()

    monkeypatch.setattr(pool, "close_old_connections", recorded)
    return seen


@pytest.fixture
def looks(monkeypatch) -> list[int]:
    """One entry per look ``after()`` makes (``pool._every_connection``, counted)."""
    seen: list[int] = []
    real = pool._every_connection

    def counted():
        seen.append(1)
        return real()

    monkeypatch.setattr(pool, "_every_connection", counted)
    return seen


def test_a_job_that_leaves_no_connection_open_skips_the_next_look(alias, calls) -> None:
    def jobs():
        kept = pool.JobConnections()
        conn = connections[alias]
        kept.before()  # a thread's first job: it looks
        conn.ensure_connection()  # the job queries
        kept.after()  # CONN_MAX_AGE 0 (Django's default): closed after the job
        closed = conn.connection is None
        kept.before()  # nothing open: nothing to look at
        return closed, len(calls)

    assert on_a_thread(jobs) == (True, 1)


def test_a_kept_connection_is_closed_before_the_first_job_past_its_max_age(alias, calls) -> None:
    settings = connections[alias].settings_dict  # shared by every thread's wrapper

    def jobs():
        kept = pool.JobConnections()
        conn = connections[alias]
        kept.before()
        conn.ensure_connection()  # close_at: 1 s from now
        raw = conn.connection
        kept.after()
        kept.before()  # within its age: kept, and not looked at
        still = conn.connection is raw
        time.sleep(1.2)
        kept.before()  # past it: closed before the job
        return still, conn.connection is None, len(calls)

    old = settings["CONN_MAX_AGE"]
    settings["CONN_MAX_AGE"] = 1
    try:
        assert on_a_thread(jobs) == (True, True, 2)
    finally:
        settings["CONN_MAX_AGE"] = old


def test_the_look_after_a_job_is_skipped_until_a_job_opens_a_connection(
    alias, looks, monkeypatch
) -> None:
    monkeypatch.setattr(pool, "LOOK_S", 60.0)  # no look for the time's sake here

    def jobs():
        kept = pool.JobConnections()
        conn = connections[alias]
        kept.after()  # a thread's first job: it looks, finds none open
        kept.after()  # a job that opened none: no look
        seen = [len(looks)]
        conn.ensure_connection()  # the next job queries (connection_created)
        kept.after()  # it looks: CONN_MAX_AGE 0 closes it
        seen += [len(looks), conn.connection is None]
        kept.after()  # none open again, none opened: no look
        return [*seen, len(looks)]

    assert on_a_thread(jobs) == [1, 2, True, 2]


def test_a_connection_opened_without_the_signal_is_still_looked_at(alias, monkeypatch) -> None:
    """A connection Django set before its setup raised (``connect()`` sends
    ``connection_created`` last), or opened by a backend of its own: no signal,
    and still closed after the job."""
    monkeypatch.setattr(pool, "LOOK_S", 60.0)

    def jobs():
        kept = pool.JobConnections()
        conn = connections[alias]
        kept.after()  # the first look: none open
        pool.connection_created.disconnect(dispatch_uid="echomq_django.pool.opened")
        try:
            conn.ensure_connection()  # opened, and not counted: no receiver
        finally:
            pool.connection_created.connect(
                pool._count_opened, weak=False, dispatch_uid="echomq_django.pool.opened"
            )
        opened = conn.connection is not None
        kept.after()  # its connection object holds one: it looks (CONN_MAX_AGE 0 closes it)
        return opened, conn.connection is None

    assert on_a_thread(jobs) == (True, True)


def test_the_look_after_a_job_is_made_once_look_s_has_passed(alias, looks, monkeypatch) -> None:
    monkeypatch.setattr(pool, "LOOK_S", 0.0)

    def jobs():
        kept = pool.JobConnections()
        for _ in range(3):
            kept.after()
        return len(looks)

    assert on_a_thread(jobs) == 3


def test_an_alias_whose_backend_cannot_load_is_passed_over(alias, looks, monkeypatch) -> None:
    handler = type(pool.connections)
    real_iter, real_item = handler.__iter__, handler.__getitem__

    def item(self, name):
        if name == "nowhere":
            raise ImproperlyConfigured("Error loading a backend that is not installed")
        return real_item(self, name)

    monkeypatch.setattr(handler, "__iter__", lambda self: iter([*real_iter(self), "nowhere"]))
    monkeypatch.setattr(handler, "__getitem__", item)

    def jobs():
        kept = pool.JobConnections()
        kept.after()  # looks: the other aliases' objects, none open, no error
        kept.after()  # skipped
        connections[alias].ensure_connection()
        kept.after()  # looks, closes it
        return len(looks), connections[alias].connection is None

    assert on_a_thread(jobs) == (2, True)
