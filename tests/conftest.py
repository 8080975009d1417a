"""Test rigs: a private Redis server and a private 3-master Redis Cluster.

Fixtures (real servers, never mocks; never a Redis the suite did not start):

- ``redis_server`` (session): URL ``redis://127.0.0.1:<port>/0`` of a private
  redis-server; also exported as ``ECHOMQ_URL`` and as the ``default`` cache
  LOCATION for the session. Started for every session (autouse) so nothing in
  a test run can fall back to a developer's Redis on 6379.
- ``redis_cluster`` (session): a ``tests.support.rigs.Cluster`` with ``ports``
  (three masters) and ``url`` (first node).
- ``redis_cluster_ha`` (session, started only by the tests that ask for it):
  3 masters + 3 replicas, ``cluster-node-timeout`` 1 s, for failover tests
  (``kill_master``, ``wait_promoted``, ``restart``).
- ``r``: ``redis.Redis`` on the private server, FLUSHALL before the test.
- ``rc``: ``RedisCluster`` on the private cluster, FLUSHALL on every master
  before the test.
- ``redis_client``: ``r`` or ``rc``; ids ``[single]`` and ``[cluster]``.
- ``mq``: ``echomq_django.EchoMQ(redis_client, prefix="emq")``, both rigs.

The kits' fixtures come in through ``pytest_plugins`` below, for every test
module: ``clock``, ``tmq``, ``seen`` and ``no_env_url``
(``tests/support/fixtures.py``), ``chromium`` and ``admin``
(``tests/support/browserkit.py``). No two plugins define the same name; a
test module's own fixture of that name wins in that module.

The fixtures here and in the plugins import echomq_django only in their
bodies, so loading them imports none of the library. ``rigs`` does: it
starts servers with ``echomq_django.testing.redis_server``, and importing
that module runs the package's ``__init__``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from tests.support import rigs

pytest_plugins = ["tests.support.fixtures", "tests.support.browserkit"]


def pytest_report_header(config) -> str:
    """Says whether the PostgreSQL legs of the outbox tests run."""
    try:
        from django.conf import settings

        where = getattr(settings, "ECHOMQ_TEST_PG", None)
    except Exception:  # settings not configured: nothing to say
        return ""
    if where:
        name = settings.DATABASES["pg"]["TEST"]["NAME"]
        return f"outbox tests on PostgreSQL too: {where} (database {name}, dropped after)"
    return (
        "outbox tests on PostgreSQL: skipped, no server at ECHOMQ_TEST_PG (default 127.0.0.1:5432)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Any test that needs the cluster rig (directly or through rc) is a
    # cluster test, so `-m "not cluster"` never starts the cluster.
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "redis_cluster" in names or "redis_cluster_ha" in names:
            item.add_marker(pytest.mark.cluster)


def _start_or_fail(start):
    try:
        return start()
    except rigs.RigError as exc:
        reason = str(exc)
    pytest.fail(reason, pytrace=False)  # outside the except: no chained traceback


@pytest.fixture(scope="session")
def redis_server() -> Iterator[str]:
    server = _start_or_fail(rigs.start_server)
    _session_rigs["redis_server"] = server
    previous = os.environ.get("ECHOMQ_URL")
    os.environ["ECHOMQ_URL"] = server.url
    try:
        yield server.url
    finally:
        if previous is None:
            os.environ.pop("ECHOMQ_URL", None)
        else:
            os.environ["ECHOMQ_URL"] = previous
        _session_rigs.pop("redis_server", None)
        server.stop()


@pytest.fixture(scope="session", autouse=True)
def _private_redis_settings(redis_server: str) -> Iterator[None]:
    # testproject.settings was imported (by pytest-django) before redis_server
    # set ECHOMQ_URL, so its cache LOCATION still holds the import-time value.
    # Point the cache at the private server; override_settings also resets the
    # cache handlers so no connection to the old LOCATION survives.
    from django.conf import settings

    if not settings.configured:
        yield
        return
    from django.test import override_settings

    caches = {alias: dict(conf) for alias, conf in settings.CACHES.items()}
    for conf in caches.values():
        if conf.get("BACKEND", "").startswith("django_redis."):
            conf["LOCATION"] = redis_server
    override = override_settings(CACHES=caches)
    override.enable()
    try:
        yield
    finally:
        override.disable()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[rigs.Cluster]:
    cluster = _start_or_fail(rigs.start_cluster)
    _session_rigs["redis_cluster"] = cluster
    try:
        yield cluster
    finally:
        _session_rigs.pop("redis_cluster", None)
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_ha() -> Iterator[rigs.Cluster]:
    cluster = _start_or_fail(lambda: rigs.start_cluster(replicas=1))
    try:
        yield cluster
    finally:
        cluster.stop()


# The session rigs whose servers must outlive every test, by fixture name:
# the single server and the plain Cluster (the replica rig's nodes are killed
# and restarted by its own tests).
_session_rigs: dict[str, rigs.RedisProcess | rigs.Cluster] = {}


@pytest.fixture(autouse=True)
def _session_rigs_outlive_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fails the test after which a session rig's server is found dead,
    naming how it ended (a signal or an exit code) and its log's tail, where
    every later test on that rig would fail with a bare "connection refused";
    a Cluster's nodes are started again so the rest of the run goes on."""
    yield
    for name, rig in list(_session_rigs.items()):
        nodes = rig.nodes if isinstance(rig, rigs.Cluster) else [rig]
        dead = [n for n in nodes if n.proc.poll() is not None]
        if not dead:
            continue
        codes = [(n.port, n.proc.returncode) for n in dead]
        tails = "\n".join(rigs.log_tail(n) for n in dead)
        if isinstance(rig, rigs.Cluster):
            rig.restart_all()
        else:
            del _session_rigs[name]  # reported once, here
        pytest.fail(
            f"the session rig {name!r} lost servers during {request.node.nodeid}: "
            f"(port, returncode) {codes} (a negative code is the signal)\n{tails}",
            pytrace=False,
        )


@pytest.fixture
def rch(redis_cluster_ha: rigs.Cluster) -> Iterator[RedisCluster]:
    """``RedisCluster`` on the replica rig, FLUSHALL on every master first."""
    live = redis_cluster_ha.live()[0]
    client = RedisCluster(host=rigs.HOST, port=live.port)
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def r(redis_server: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server)
    client.flushall()  # our private server: nothing else lives there
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def rc(redis_cluster: rigs.Cluster) -> Iterator[RedisCluster]:
    client = RedisCluster(host=rigs.HOST, port=redis_cluster.ports[0])
    client.flushall(target_nodes=RedisCluster.PRIMARIES)
    try:
        yield client
    finally:
        client.close()


RIGS = [
    pytest.param("single", id="single"),
    pytest.param("cluster", id="cluster", marks=pytest.mark.cluster),
]


@pytest.fixture(params=RIGS)
def redis_client(request: pytest.FixtureRequest) -> redis.Redis | RedisCluster:
    """The test's Redis client; the test runs once per rig."""
    return request.getfixturevalue("r" if request.param == "single" else "rc")


@pytest.fixture
def mq(redis_client, request: pytest.FixtureRequest):
    """An EchoMQ on the test's rig (prefix ``emq``), one run per rig; under
    the ``via_flow_outbox`` marker, see ``fixtures.fan_in_options``."""
    import echomq_django  # lazy: the library may not import yet
    from tests.support.fixtures import fan_in_options

    return echomq_django.EchoMQ(redis_client, prefix="emq", **fan_in_options(request))


@pytest.fixture(scope="session")
def subprocess_db(tmp_path_factory) -> Iterator[str]:
    """A migrated SQLite file for the ``manage.py`` subprocesses of the e2e
    tests, exported as ``ECHOMQ_DB_PATH`` (testproject's settings read it):
    without ``migrate`` the commands say so, and the repo's own
    ``db.sqlite3`` is left alone."""
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path_factory.mktemp("db") / "e2e.sqlite3"
    previous = os.environ.get("ECHOMQ_DB_PATH")
    os.environ["ECHOMQ_DB_PATH"] = str(path)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=Path(__file__).resolve().parent.parent,
        check=True,
        timeout=300,
    )
    try:
        yield str(path)
    finally:
        if previous is None:
            os.environ.pop("ECHOMQ_DB_PATH", None)
        else:
            os.environ["ECHOMQ_DB_PATH"] = previous
