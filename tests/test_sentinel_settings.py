"""The Redis Sentinel settings (docs/howto/sentinel.md): ``SENTINELS`` /
``MASTER_NAME`` / ``SENTINEL_KWARGS`` and the ``redis+sentinel://`` URL,
checked before anything connects (E060-E064), parsed, and built into a
client that asks the sentinels. The failover itself is in
tests/faults/test_sentinel_failover.py."""

from __future__ import annotations

import pytest

from echomq_django import conf
from echomq_django.conf.schema import problems
from echomq_django.protocol.connection import FollowMaster, parse_sentinel_url
from echomq_django.protocol.errors import describe

SENTINELS = [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
GOOD = {"SENTINELS": SENTINELS, "MASTER_NAME": "mymaster"}
E062 = "ECHOMQ MASTER_NAME must be a non-empty string and SENTINEL_KWARGS a dict, "


def found(cfg):
    return [(cid, message) for cid, message, _hint in problems(cfg)]


def test_sentinels_with_a_master_name_are_a_connection(no_env_url) -> None:
    assert found(GOOD) == []
    assert found(GOOD | {"SENTINEL_KWARGS": {"password": "s3cret"}}) == []
    assert found({"SENTINELS": [["h", 1]], "MASTER_NAME": "m"}) == []  # lists from JSON


@pytest.mark.parametrize(
    ("cfg", "expected"),
    [
        (
            {"SENTINELS": SENTINELS},
            ("echomq_django.E060", "ECHOMQ SENTINELS is set without MASTER_NAME"),
        ),
        (
            {"MASTER_NAME": "m", "URL": "redis://h/0"},
            ("echomq_django.E060", "ECHOMQ MASTER_NAME set without SENTINELS"),
        ),
        (
            {"SENTINEL_KWARGS": {}, "MASTER_NAME": "m", "URL": "redis://h/0"},
            ("echomq_django.E060", "ECHOMQ MASTER_NAME and SENTINEL_KWARGS set without SENTINELS"),
        ),
        (
            GOOD | {"SENTINELS": [("h", 0)]},
            (
                "echomq_django.E061",
                "ECHOMQ SENTINELS must be a non-empty list of (host, port) pairs, got [('h', 0)]",
            ),
        ),
        (
            GOOD | {"SENTINELS": []},
            (
                "echomq_django.E061",
                "ECHOMQ SENTINELS must be a non-empty list of (host, port) pairs, got []",
            ),
        ),
        (
            GOOD | {"SENTINELS": "h:26379"},
            (
                "echomq_django.E061",
                "ECHOMQ SENTINELS must be a non-empty list of (host, port) pairs, got 'h:26379'",
            ),
        ),
        (
            GOOD | {"MASTER_NAME": ""},
            (
                "echomq_django.E062",
                E062 + "got '' and {}",
            ),
        ),
        (
            GOOD | {"SENTINEL_KWARGS": "pw"},
            (
                "echomq_django.E062",
                E062 + "got 'mymaster' and 'pw'",
            ),
        ),
        (
            GOOD | {"URL": "redis://h/0", "CLUSTER": True},
            (
                "echomq_django.E063",
                "ECHOMQ SENTINELS is set beside CLUSTER, URL: name one connection",
            ),
        ),
        (
            {"URL": "redis+sentinel://h/m", "CLUSTER": True},
            ("echomq_django.E063", "ECHOMQ URL is a Sentinel URL but CLUSTER is set"),
        ),
        (
            {"URL": "redis+sentinel://h:port/m"},
            (
                "echomq_django.E064",
                "'redis+sentinel://h:port/m' is not a Sentinel URL: "
                "redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/master_name[/db]",
            ),
        ),
    ],
    ids=[
        "no-name",
        "name-alone",
        "kwargs-alone",
        "port-0",
        "empty",
        "a-string",
        "empty-name",
        "kwargs-not-dict",
        "beside-url",
        "url-and-cluster",
        "bad-url",
    ],
)
def test_bad_sentinel_settings_are_refused_by_id(no_env_url, cfg, expected) -> None:
    assert expected in found(cfg)
    assert [cid for cid, _m in found(cfg)] == [expected[0]]


def test_a_sentinel_url_parses_into_sentinels_name_and_master_options() -> None:
    assert parse_sentinel_url("redis+sentinel://a:1,b/mymaster/3") == (
        [("a", 1), ("b", 26379)],
        "mymaster",
        {"db": 3},
    )
    assert parse_sentinel_url("redis+sentinel://u:p%40ss@a/m") == (
        [("a", 26379)],
        "m",
        {"username": "u", "password": "p@ss"},
    )
    for bad in (
        "redis+sentinel://a/",
        "redis+sentinel://a/m/x",
        "redis+sentinel://:1/m",
        "redis+sentinel://a/m?db=1",
        "redis://a/m",
    ):
        with pytest.raises(ValueError, match="is not a Sentinel URL"):
            parse_sentinel_url(bad)


def test_the_client_asks_the_sentinels_and_follows_a_refusing_master(no_env_url) -> None:
    client = conf.build_client(GOOD | {"OPTIONS": {"db": 2}, "SENTINEL_KWARGS": {"password": "x"}})
    pool = client.connection_pool  # nothing connected yet
    assert (pool.service_name, pool.connection_class, pool.connection_kwargs["db"]) == (
        "mymaster",
        FollowMaster,
        2,
    )
    sentinels = pool.sentinel_manager.sentinels
    assert [
        (s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"])
        for s in sentinels
    ] == SENTINELS
    assert {s.connection_pool.connection_kwargs["password"] for s in sentinels} == {"x"}
    # what an outage message names: the master the client follows
    assert describe(client) == "Sentinel master 'mymaster'"


def test_the_environment_url_wins_over_sentinels(no_env_url, monkeypatch) -> None:
    monkeypatch.setenv("ECHOMQ_URL", "redis://127.0.0.1:1/0")
    assert found(GOOD) == []
    assert conf.build_client(GOOD).connection_pool.connection_kwargs["port"] == 1
