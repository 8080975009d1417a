"""Django's rule for database connections around each job, as a handler
meets it through a running worker (docs/howto/deploy.md#database-connections):
on a handler thread and in a handler process, on a file SQLite database and
on PostgreSQL, a connection is kept within its ``CONN_MAX_AGE`` and not
past it; one that a job left unusable (its backend terminated under it) or
out of autocommit is closed after that job; with ``CONN_HEALTH_CHECKS`` a
connection PostgreSQL terminated between two jobs is replaced at the next
job's first query."""

from __future__ import annotations

import time

import pytest
from django.db import connections, transaction

from echomq_django import JobState, Worker, handler
from tests.support.fixtures import database_params
from tests.support.workerkit import Background, wait_for

ALIASES = [p for p in database_params(sqlite_file=True) if p.values[0] != "default"]
PG = [p for p in ALIASES if p.values[0] == "pg"]
POOLS = ["thread", "process"]
pytestmark = pytest.mark.django_db(transaction=True, databases="__all__")
SQL_SESSION = {"pg": "SELECT pg_backend_pid()", "sqlite_file": "SELECT 1"}


@handler("dbc.session")
def session(job):
    """``[pid or 0, the session marker seen before this job set it, autocommit]``:
    on PostgreSQL the backend's pid; on SQLite 0, and the marker is a temp table
    (a connection's own) this job creates."""
    alias = job.payload
    with connections[alias].cursor() as cur:
        if alias == "pg":
            cur.execute("SELECT pg_backend_pid(), current_setting('emq.mark', true)")
            pid, mark = cur.fetchone()
            cur.execute("SELECT set_config('emq.mark', 'seen', false)")
        else:
            cur.execute("SELECT count(*) FROM sqlite_temp_master WHERE name = 'emq_mark'")
            pid, mark = 0, "seen" if cur.fetchone()[0] else None
            cur.execute("CREATE TEMP TABLE IF NOT EXISTS emq_mark (x int)")
    return [pid, mark or None, connections[alias].get_autocommit()]


@handler("dbc.die")
def die(job):
    """Terminates its own PostgreSQL backend: the query raises, the connection is unusable."""
    with connections[job.payload].cursor() as cur:
        cur.execute("SELECT pg_terminate_backend(pg_backend_pid())")


@handler("dbc.no_autocommit")
def no_autocommit(job):
    """Leaves its connection out of autocommit, a transaction open."""
    transaction.set_autocommit(False, using=job.payload)
    with connections[job.payload].cursor() as cur:
        cur.execute(SQL_SESSION[job.payload])
    return "left"


@pytest.fixture
def db_settings(request):
    """Set keys of the alias's settings (shared by every thread's wrapper, inherited
    by a handler process forked after) for the test."""
    saved: list = []

    def set_(alias, **values):
        settings = connections[alias].settings_dict
        saved.append((settings, {k: settings.get(k) for k in values}))
        settings.update(values)

    yield set_
    for settings, old in saved:
        settings.update(old)


class OneHandler:
    """A worker with one handler (every job on the same thread or process)."""

    def __init__(self, mq, pool):
        self.mq, self.n = mq, 0
        self.worker = Worker(["dbq"], mq=mq, concurrency=1, pool=pool, register=False,
                             block_timeout=0.5)  # fmt: skip
        self.bg = Background(self.worker)

    def run(self, name, alias, state=JobState.COMPLETED):
        self.n += 1
        job_id = f"j{self.n}"
        self.mq.enqueue("dbq", name, alias, job_id=job_id, max_attempts=1)
        wait_for(lambda: self.mq.get_job("dbq", job_id).state is state, timeout=30,
                 what=f"{name} {state}")  # fmt: skip
        return self.mq.get_job("dbq", job_id)

    def close(self):
        self.worker.stop()
        self.bg.join(60)


@pytest.fixture
def one(mq):
    made = []

    def make(pool):
        made.append(OneHandler(mq, pool))
        return made[-1]

    yield make
    for w in made:
        w.close()


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("alias", ALIASES)
@pytest.mark.parametrize(("max_age", "kept"), [(0, False), (60, True), (None, True)])
def test_a_connection_is_kept_within_its_max_age_only(one, db_settings, pool, alias, max_age, kept):
    db_settings(alias, CONN_MAX_AGE=max_age)
    w = one(pool)
    first = w.run("dbc.session", alias).result
    second = w.run("dbc.session", alias).result
    assert first[1:] == [None, True]
    assert second[1:] == (["seen", True] if kept else [None, True])


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_connection_past_its_max_age_is_replaced_before_the_next_job(
    one, db_settings, pool, alias
):
    db_settings(alias, CONN_MAX_AGE=1)
    w = one(pool)
    assert w.run("dbc.session", alias).result[1] is None
    assert w.run("dbc.session", alias).result[1] == "seen"  # within its age
    time.sleep(1.3)
    assert w.run("dbc.session", alias).result[1] is None


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("alias", ALIASES)
def test_a_job_that_leaves_autocommit_off_has_its_connection_closed(one, db_settings, pool, alias):
    db_settings(alias, CONN_MAX_AGE=None)
    w = one(pool)
    assert w.run("dbc.session", alias).result[1] is None
    assert w.run("dbc.no_autocommit", alias).result == "left"
    assert w.run("dbc.session", alias).result[1:] == [None, True]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("alias", PG)
@pytest.mark.parametrize("checks", [False, True], ids=["no-health-checks", "health-checks"])
def test_a_job_whose_backend_died_under_it_leaves_a_fresh_connection(
    one, db_settings, pool, alias, checks
):
    db_settings(alias, CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=checks)
    w = one(pool)
    pid = w.run("dbc.session", alias).result[0]
    died = w.run("dbc.die", alias, state=JobState.DEAD)
    assert "terminat" in died.error.lower() or "closed" in died.error.lower(), died.error
    after = w.run("dbc.session", alias).result
    assert after[0] != pid and after[1:] == [None, True]


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("alias", PG)
def test_health_checks_replace_a_connection_terminated_between_jobs(one, db_settings, pool, alias):
    db_settings(alias, CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)
    w = one(pool)
    pid, mark, _ = w.run("dbc.session", alias).result
    assert mark is None
    assert w.run("dbc.session", alias).result == [pid, "seen", True]  # kept
    with connections[alias].cursor() as cur:  # the test's own connection
        cur.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert cur.fetchone() == (True,)
    gone = lambda: not _alive(alias, pid)  # noqa: E731
    wait_for(gone, what="the backend to end")
    after = w.run("dbc.session", alias).result
    assert after[0] != pid and after[1:] == [None, True]


def _alive(alias, pid) -> bool:
    with connections[alias].cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return cur.fetchone()[0] == 1
