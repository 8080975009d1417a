"""The protocol's edge: every public call of ``EchoMQ`` and its parts raises
our errors only (docs/explanation/house.md, "protocol/"), so nothing above
``protocol/`` catches a redis-py error."""

from __future__ import annotations

import inspect

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ, RedisCommandError, RedisUnavailable
from echomq_django.protocol import wire
from echomq_django.testing.redis_server import free_port


def parts() -> list[type]:
    """Every part class: ``EchoMQ`` and the classes of its parts."""
    found, todo = set(), [wire.Part]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("echomq_django.protocol") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return sorted(found, key=lambda c: c.__qualname__)


def test_every_public_method_of_every_part_translates():
    names = {c.__qualname__ for c in parts()}
    assert {"EchoMQ", "Outbox", "SignalEvents", "Lifecycle", "Timers", "Presence"} <= names
    bare = [
        f"{cls.__qualname__}.{name}"
        for cls in parts()
        for name, value in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(value)
        if not getattr(value, "translating", False)
    ]
    assert bare == []


def test_a_refusal_that_is_not_ours_is_a_redis_command_error(r):
    mq = EchoMQ(r, prefix="emq")
    r.set(mq.keys.job("q", "j"), "a string where a hash belongs")
    with pytest.raises(RedisCommandError, match="Redis refused a command: ResponseError") as err:
        mq.get_job("q", "j")
    assert isinstance(err.value.__cause__, redis.exceptions.ResponseError)
    assert "WRONGTYPE" in str(err.value)


def test_redis_away_is_redis_unavailable_naming_the_address():
    port = free_port()
    mq = EchoMQ(redis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0)))
    with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}|localhost:{port}") as err:
        mq.counts("q")
    assert isinstance(err.value.__cause__, redis.exceptions.ConnectionError)
    with pytest.raises(RedisUnavailable):
        mq.outbox.length("q")  # a part: the same edge
    with pytest.raises(RedisUnavailable):
        mq.presence.live_processes()
