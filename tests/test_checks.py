"""Settings and system checks: stable ids, hints, no Redis I/O (but for the
deploy checks, which ask the server), and the client each connection setting builds."""

from __future__ import annotations

import contextlib
import logging

import django
import pytest
import redis
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings
from redis.cluster import RedisCluster

from echomq_django import conf

pytestmark = pytest.mark.usefixtures("no_env_url")  # the settings are the test's alone

GOOD = {"URL": "redis://127.0.0.1:1/0", "QUEUES": {"orders": {"MAX_ATTEMPTS": 3}}}


def ids(cfg):
    # databases=[]: the static checks only. Django 6 runs the model checks
    # against every database when none is named, which needs a DB fixture.
    with override_settings(ECHOMQ=cfg):
        return [m.id for m in run_checks(databases=[]) if m.id.startswith("echomq_django.")]


@pytest.mark.parametrize(
    "cfg,expected",
    [
        (GOOD, []),
        ({}, ["echomq_django.E001"]),
        ({"URL": "http://127.0.0.1/"}, ["echomq_django.E002"]),
        ({**GOOD, "PREFIX": "a:b"}, ["echomq_django.E006"]),
        ({**GOOD, "HOST": "x"}, ["echomq_django.E003"]),
        ({"CACHE": "nope"}, ["echomq_django.E004"]),
        ({"URL": "redis://127.0.0.1:1/0", "CACHE": "default"}, ["echomq_django.E025"]),
        ({**GOOD, "QUEUES": []}, ["echomq_django.E007"]),
        ({**GOOD, "QUEUES": {"bad name": {}}}, ["echomq_django.E008"]),
        ({**GOOD, "QUEUES": {"orders": {"RETRIES": 3}}}, ["echomq_django.E009"]),
        ({**GOOD, "QUEUES": {"orders": {"KEEP_LOGS": 20}}}, []),
        ({**GOOD, "QUEUES": {"orders": {"KEEP_LOGS": 0}}}, ["echomq_django.E019"]),
        ({**GOOD, "QUEUES": {"orders": {"KEEP_LOGS": "100"}}}, ["echomq_django.E019"]),
        ({**GOOD, "QUEUES": {"orders": {"KEEP_LOGS": True}}}, ["echomq_django.E019"]),
        ({**GOOD, "QUEUES": {"orders": {"KEEP_LOGS": 10_001}}}, ["echomq_django.E019"]),
        ({**GOOD, "QUEUES": {"orders": {"MAX_ATTEMPTS": 0}}}, ["echomq_django.E010"]),
        ({**GOOD, "QUEUES": {"orders": {"LEASE_MS": "30s"}}}, ["echomq_django.E010"]),
        ({**GOOD, "JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder"}, []),
        ({**GOOD, "JSON_ENCODER": "no.such.Encoder"}, ["echomq_django.E033"]),
        ({**GOOD, "JSON_ENCODER": "django.utils.timezone.now"}, ["echomq_django.E033"]),
    ],
)
def test_each_problem_has_a_stable_id(cfg, expected):
    assert ids(cfg) == expected


def test_messages_carry_hints_naming_the_rule():
    with override_settings(ECHOMQ={**GOOD, "QUEUES": {"a{b}": {}}}):
        [msg] = [m for m in run_checks(databases=[]) if m.id == "echomq_django.E008"]
    assert "invalid queue name 'a{b}'" in msg.msg
    assert "A-Z a-z 0-9 _ . -" in msg.msg
    assert msg.hint == "Rename the queue in ECHOMQ['QUEUES']."


def test_cache_alias_must_be_django_redis():
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    with override_settings(CACHES=caches):
        assert ids({"CACHE": "default"}) == ["echomq_django.E005"]


def test_djangos_own_redis_cache_is_accepted_and_shared(redis_server, r):
    caches = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": redis_server,
        }
    }
    with override_settings(CACHES=caches):
        assert ids({"CACHE": "default"}) == []
        mq = conf.get_mq()
        assert mq.enqueue("orders", "x", {"a": 1}, job_id="j1") == "j1"
    assert isinstance(mq.client, redis.Redis)
    assert r.hget("emq:{orders}:job:j1", "n") == b"x"


def test_env_url_overrides_settings(monkeypatch):
    monkeypatch.setenv("ECHOMQ_URL", "redis://127.0.0.1:7/3")
    with override_settings(ECHOMQ={"URL": "http://wrong/"}):
        assert ids({"URL": "http://wrong/"}) == []
        client = conf.get_mq().client
    kw = client.connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"]) == ("127.0.0.1", 7, 3)


def test_a_bad_env_url_is_named_as_the_environment_variable(monkeypatch):
    """ECHOMQ_URL wins over the settings: its E002 says where the value came from."""
    monkeypatch.setenv("ECHOMQ_URL", "localhost:6400")
    [(cid, message, _)] = conf.problems({"URL": "redis://127.0.0.1:6400/0"})
    assert (cid, message) == (
        "echomq_django.E002",
        "ECHOMQ_URL (the environment variable) 'localhost:6400' is not a Redis URL",
    )
    monkeypatch.delenv("ECHOMQ_URL")
    [(_, message, _)] = conf.problems({"URL": "localhost:6400"})
    assert message == "ECHOMQ URL 'localhost:6400' is not a Redis URL"


def test_get_mq_refuses_bad_settings_naming_every_problem():
    with override_settings(ECHOMQ={"URL": "http://x/", "PREFIX": ""}):
        with pytest.raises(ImproperlyConfigured) as err:
            conf.get_mq()
    assert "echomq_django.E002" in str(err.value) and "echomq_django.E006" in str(err.value)


@pytest.mark.parametrize(
    "queue,expected",
    [
        ({"TIMEOUT_MS": "5s"}, ["echomq_django.E051"]),
        ({"RATE_LIMIT": {"MAX": 5}}, ["echomq_django.E050"]),
        (
            {"RATE_LIMIT": {"MAX": 100_001, "PER_MS": 1000, "MODE": "sliding"}},
            ["echomq_django.E059"],
        ),
    ],
)
def test_a_bad_runtime_setting_refuses_the_enqueue_and_is_reported_once(
    r, redis_server, queue, expected
):
    """A queue's RATE_LIMIT and TIMEOUT_MS are read by workers only, yet a
    process that runs no check (a web process under gunicorn) must not add
    jobs no worker would start for: ``get_mq()`` refuses them, nothing is
    written; the system checks report each once."""
    import echomq_django

    cfg = {"URL": redis_server, "QUEUES": {"orders": queue}}
    assert ids({**cfg, "URL": "redis://127.0.0.1:1/0"}) == expected
    conf.reset()
    with override_settings(ECHOMQ=cfg):
        with pytest.raises(ImproperlyConfigured) as err:
            echomq_django.enqueue("orders", "x", {"a": 1})
    assert str(err.value).startswith(expected[0] + ": queue 'orders': ")
    assert r.dbsize() == 0


def test_clients_built_from_each_connection_setting(redis_server, redis_cluster):
    with override_settings(ECHOMQ={"URL": redis_server, "PREFIX": "t1"}):
        mq = conf.get_mq()
    assert isinstance(mq.client, redis.Redis) and mq.keys.prefix == "t1"
    assert mq.client.ping()
    conf.reset()
    with override_settings(ECHOMQ={"CACHE": "default"}):
        assert conf.get_mq().client.ping()
    conf.reset()
    with override_settings(ECHOMQ={"URL": redis_cluster.url, "CLUSTER": True}):
        mq = conf.get_mq()
    assert isinstance(mq.client, RedisCluster)
    assert mq.enqueue("orders", "x", {"a": 1}, job_id="j1") == "j1"
    assert mq.get_job("orders", "j1").payload == {"a": 1}


def test_no_redis_io_at_import_or_in_ready(r, redis_server):
    """ready() and the checks open no connection: the private server's
    connection counter does not move."""
    from django.apps import apps

    before = r.info("stats")["total_connections_received"]
    with override_settings(ECHOMQ={"URL": redis_server}):
        apps.get_app_config("echomq_django").ready()
        run_checks(databases=[])
    assert r.info("stats")["total_connections_received"] == before


def test_no_test_runs_the_database_checks_by_accident():
    """Django 6's ``run_checks()`` runs the model checks against every
    database unless ``databases=[]`` says not to, which a test without a DB
    fixture may not do: the Django 6 leg of the matrix fails there alone."""
    from pathlib import Path

    here = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(here.parent)}:{n}"
        for path in sorted(here.parent.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "run_checks()" in line and "def " not in line and path != here
    ]
    assert offenders == []


# -- settings that would misbehave; the deploy checks ask the server -----------


def check_ids(cfg, deploy: bool = False) -> list[str]:
    from django.core.checks import run_checks
    from django.test import override_settings

    with override_settings(ECHOMQ=cfg):
        found = run_checks(databases=[], include_deployment_checks=deploy)
        return [m.id for m in found if m.id.startswith("echomq_django.")]


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({**GOOD, "QUEUES": {"orders": {"LEASE_MS": 0}}}, ["echomq_django.E011"]),
        (
            {**GOOD, "QUEUES": {"orders": {"LEASE_MS": 365 * 86_400_000 + 1}}},
            ["echomq_django.E011"],
        ),
        ({**GOOD, "QUEUES": {"orders": {"LEASE_MS": 365 * 86_400_000}}}, []),
        ({**GOOD, "MAX_PAYLOAD_BYTES": "1000"}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": -1}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": 0}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": True}, ["echomq_django.E012"]),
        ({**GOOD, "OPTIONS": {"bogus": 1}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": ["socket_timeout"]}, ["echomq_django.E013"]),
        ({**GOOD, "CLUSTER": "yes"}, ["echomq_django.E014"]),
        ({**GOOD, "OPTIONS": {"socket_timeout": 5}, "MAX_PAYLOAD_BYTES": 1000}, []),
        # values redis-py takes only at the first call (0: every call fails as if Redis were down)
        ({**GOOD, "OPTIONS": {"socket_timeout": 0}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": {"socket_connect_timeout": "x"}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": {"health_check_interval": -1}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": {"protocol": 5}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": {"encoding": "bogus-enc"}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": {"protocol": 3, "socket_timeout": 2.5}}, []),
        ({"CACHE": "default", "OPTIONS": {"db": 7}}, ["echomq_django.E013"]),  # ignored there
        ({**GOOD, "CLUSTER": True, "OPTIONS": {"read_from_replicas": True}}, []),
    ],
)
def test_settings_that_would_misbehave_fail_the_check(cfg, expected):
    assert check_ids(cfg) == expected


def test_check_deploy_compares_cluster_with_the_server(redis_server, redis_cluster):
    single, node = redis_server, redis_cluster.url
    assert check_ids({"URL": single}, deploy=True) == []
    assert check_ids({"URL": single, "CLUSTER": True}, deploy=True) == ["echomq_django.E015"]
    assert check_ids({"URL": single, "CLUSTER": True}) == []  # plain check: no Redis I/O
    assert check_ids({"URL": node, "CLUSTER": True}, deploy=True) == []
    assert check_ids({"URL": node}, deploy=True) == ["echomq_django.E016"]
    assert check_ids({"URL": single.replace("/0", "/99")}, deploy=True) == ["echomq_django.E017"]
    [(_, message, _)] = conf.server_problems({"URL": node})
    assert message == f"{node}: this is a Redis Cluster node: set CLUSTER"


def test_a_lease_s_type_error_names_the_lease_s_own_floor():
    [(cid, message, _)] = conf.problems({**GOOD, "QUEUES": {"orders": {"LEASE_MS": "30s"}}})
    assert (cid, message) == (
        "echomq_django.E010",
        "queue 'orders': LEASE_MS must be an integer >= 1, got '30s'",  # 0 is refused too: E011
    )


def test_an_echomq_setting_that_is_not_a_dict_is_one_check_error():
    with override_settings(ECHOMQ=5):
        found = [m for m in run_checks(databases=[], include_deployment_checks=True)
                 if m.id.startswith("echomq_django.")]  # fmt: skip
        assert [(m.id, m.msg) for m in found] == [
            ("echomq_django.E026", "ECHOMQ must be a dict, got int")
        ]


def test_check_deploy_warns_of_a_server_that_evicts_keys(caplog):
    from django.core.checks import WARNING, run_checks

    from echomq_django.conf import server
    from echomq_django.testing.redis_server import start_server

    evicting = start_server(options={"maxmemory-policy": "allkeys-lru"})
    url = f"redis://127.0.0.1:{evicting.port}/0"
    try:
        with override_settings(ECHOMQ={"URL": url}):
            [found] = [m for m in run_checks(databases=[], include_deployment_checks=True)
                       if m.id.startswith("echomq_django.")]  # fmt: skip
            assert (found.id, found.level) == ("echomq_django.W018", WARNING)
            assert found.msg == (
                f"Redis at {url} evicts keys (maxmemory-policy allkeys-lru): an evicted key "
                "is a lost job, or a flow that never finishes"
            )
            assert check_ids({"URL": url}) == []  # a plain check: no Redis I/O
            server._warned.clear()
            with caplog.at_level(logging.WARNING, logger="echomq_django"):
                conf.check_server()  # a runner's start goes on, warned once
                conf.check_server()
            assert [r.getMessage()[:40] for r in caplog.records] == [
                f"Redis at {url} evicts keys"[:40]
            ]
    finally:
        evicting.stop()
        server._warned.clear()


def test_check_deploy_asks_a_silent_server_once():
    """The deploy checks' probe (``server_facts``) asks once, within its 1 s
    timeout, and says nothing: redis-py's default retry would connect four
    times (about 4 s) before giving up. A listener that accepts and never
    answers counts the connections made."""
    import socket
    import threading

    from echomq_django.protocol.connection import server_facts

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted = []

    def accept():
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    try:
        assert server_facts(url, timeout_s=0.2) is None
        assert len(accepted) == 1
    finally:
        listener.close()
        for conn in accepted:
            conn.close()


# another backend beside ours: the framework's own, from Django 6 or the backport
IMMEDIATE = ("django.tasks" if django.VERSION >= (6,) else "django_tasks") + (
    ".backends.immediate.ImmediateBackend"
)
TASKS_OURS = {
    "default": {"BACKEND": "echomq_django.tasks.EchoMQBackend", "QUEUES": ["orders"]},
    "other": {"BACKEND": IMMEDIATE},
}


def test_a_tasks_setting_without_a_tasks_framework_is_e034(monkeypatch) -> None:
    """Django 5.2 ignores ``TASKS``: without the backport nothing loads our
    backend, and workers would kill every task job (docs/howto/tasks-backend.md)."""
    with override_settings(TASKS=TASKS_OURS):
        assert "echomq_django.E034" not in ids(GOOD)  # the backport is installed here
        monkeypatch.setattr("echomq_django.checks.tasks_framework", lambda: None)
        with override_settings(ECHOMQ=GOOD):
            found = [m for m in run_checks(databases=[]) if m.id == "echomq_django.E034"]
    assert [m.msg for m in found] == [
        "TASKS['default'] names 'echomq_django.tasks.EchoMQBackend', but no tasks framework "
        "is importable: Django 5.2 has no django.tasks and the django-tasks backport is not "
        "installed, so this backend cannot serve it"
    ]
    assert found[0].hint.startswith("pip install django-tasks")


NOT_A_DB = "is not a db index (a whole number, as in /0)"


@pytest.mark.parametrize(
    "url, flaw",
    [
        (
            "redis://127.0.0.1:6390/1/2",
            "its path '/1/2' is not a db index (a whole number, as in /0)",
        ),  # redis-py: db 12
        (
            "redis://127.0.0.1:6390/abc",
            "its path '/abc' is not a db index (a whole number, as in /0)",
        ),  # redis-py: db 0
        (
            "redis://127.0.0.1:6390/-1",
            "its path '/-1' is not a db index (a whole number, as in /0)",
        ),
        ("redis://127.0.0.1:notaport/0", "its port is not a number from 1 to 65535 ('notaport')"),
        ("rediss://127.0.0.1:99999/0", "its port is not a number from 1 to 65535 ('99999')"),
        (
            "redis://app:TopSecret@127.0.0.1:6390/x",
            f"its path '/x' {NOT_A_DB}",
        ),
        ("redis://127.0.0.1:6390", None),
        ("redis://127.0.0.1:6390/", None),
        ("redis://127.0.0.1:6390/0/", None),
        ("redis://127.0.0.1:6390/abc?db=2", None),  # the query's db wins
        ("rediss://app:TopSecret@127.0.0.1:6390/15", None),
        ("unix:///tmp/redis.sock?db=2", None),
    ],
)
def test_a_url_redis_py_would_misread_is_e002_and_no_password_shows(monkeypatch, url, flaw):
    """redis-py reads ``/1/2`` as db 12 and ``/abc`` as db 0 without a word;
    the settings check refuses them (and bad ports) as E002, naming the flaw,
    and shows the URL with its password written ``***``."""
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    found = [p for p in conf.problems({"URL": url}) if p[0] == "echomq_django.E002"]
    if flaw is None:
        assert found == []
        return
    [(_, message, hint)] = found
    shown = url.replace(":TopSecret@", ":***@")
    assert message == f"ECHOMQ URL {shown!r} is not a Redis URL: {flaw}"
    assert "TopSecret" not in message and hint.startswith("redis://[[user]:password@]host")


def test_refused_credentials_and_a_cluster_setting_the_server_refutes_stop_a_start_at_once(
    monkeypatch, redis_server, caplog
):
    """A runner waits out a Redis that does not answer, but not a setting the
    server refutes: a password it refuses (E024, with the deploy checks) or
    CLUSTER on a plain server (E015) stop the start at once, as waiting
    would not mend them; neither message shows the password."""
    import threading

    from echomq_django.runners.outage import reach_redis_at_start
    from tests.support.rigs import start_server

    log = logging.getLogger("echomq_django.test_checks")
    locked = start_server()
    locked.client().config_set("requirepass", "s3cret")
    try:
        for url, said in [
            (f"redis://:wrong-pw@127.0.0.1:{locked.port}/0", "invalid username-password pair"),
            (f"redis://127.0.0.1:{locked.port}/0", "authenticated"),  # redis-py 8 says HELLO first
        ]:
            monkeypatch.setenv("ECHOMQ_URL", url)
            conf.reset()
            [(cid, message, _)] = conf.server_problems({})
            assert (cid, said in message, "wrong-pw" in message) == (
                "echomq_django.E024",
                True,
                False,
            )
            with pytest.raises(ImproperlyConfigured, match=r"echomq_django\.E024") as err:
                reach_redis_at_start(True, log, threading.Event())
            assert "wrong-pw" not in str(err.value)
        monkeypatch.setenv("ECHOMQ_URL", f"redis://:s3cret@127.0.0.1:{locked.port}/0")
        assert conf.server_problems({}) == []
        # the password in OPTIONS, as the client sends it (the URL's would win)
        monkeypatch.setenv("ECHOMQ_URL", f"redis://127.0.0.1:{locked.port}/0")
        assert conf.server_problems({"OPTIONS": {"password": "s3cret"}}) == []
        [(cid, _, _)] = conf.server_problems({"OPTIONS": {"password": "nope"}})
        assert cid == "echomq_django.E024"
        monkeypatch.setenv("ECHOMQ_URL", redis_server)
        conf.reset()
        with override_settings(ECHOMQ={"URL": redis_server, "CLUSTER": True}):
            with pytest.raises(ImproperlyConfigured, match=r"echomq_django\.E015"):
                reach_redis_at_start(True, log, threading.Event())
    finally:
        locked.stop()
        conf.reset()
    assert not [r for r in caplog.records if "retrying" in r.getMessage()]


def test_a_password_never_shows_in_the_wait_for_redis(monkeypatch, caplog):
    """The runner's "Redis unreachable at ..." lines name the URL with its
    password written ``***``."""
    import threading

    from echomq_django.runners.outage import reach_redis_at_start
    from tests.support.rigs import free_port

    port = free_port()
    monkeypatch.setenv("ECHOMQ_URL", f"redis://app:TopSecret@127.0.0.1:{port}/0")
    conf.reset()
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    try:
        with caplog.at_level(logging.WARNING, logger="echomq_django.test_checks"):
            assert (
                reach_redis_at_start(True, logging.getLogger("echomq_django.test_checks"), stop)
                is None
            )
    finally:
        conf.reset()
    said = [r.getMessage() for r in caplog.records]
    assert said[0].startswith(f"Redis unreachable at redis://app:***@127.0.0.1:{port}/0 (")
    assert not [m for m in said if "TopSecret" in m]


@pytest.mark.parametrize(
    "url, shown",
    [
        ("redis://app:TopSecret@h:6379/0", "redis://app:***@h:6379/0"),
        ("redis://app:Top@Secret@h/0", "redis://app:***@h/0"),  # the parser's last @
        ("redis://h/0?password=TopSecret&db=1", "redis://h/0?password=***&db=1"),
        ("unix:///s.sock?db=0&password=TopSecret", "unix:///s.sock?db=0&password=***"),
        ("redis+sentinel://:TopSecret@h1:26379,h2/m/1", "redis+sentinel://:***@h1:26379,h2/m/1"),
        ("redis://app@h/0", "redis://app@h/0"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_a_url_is_shown_with_its_password_hidden(url, shown):
    from echomq_django.protocol.connection import redacted

    assert redacted(url) == shown


def test_a_bad_sentinel_url_hides_its_password(monkeypatch):
    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    [message] = [m for i, m, _ in conf.problems({"URL": "redis+sentinel://:TopSecret@/"})
                 if i == "echomq_django.E064"]  # fmt: skip
    assert "TopSecret" not in message and ":***@" in message
