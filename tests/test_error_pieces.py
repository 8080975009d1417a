"""A long error is kept in pieces of at most 64 bytes (lua/lib/error.lua;
README protocol notes, "Errors in pieces"), so a small row stays a compact
listpack; every reader sees the whole error. Both rigs."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, JobState
from echomq_django.monitoring.mirror import job_from_row
from tests.support.jobkit import (
    assert_state,
    claim_one,
    complete,
    jref,
    kill,
    leaf,
    node,
    raw_row,
)

PIECE = 64  # bytes (lib/error.lua ERROR_PIECE; Redis' hash-max-listpack-value)
# a traceback with characters of 2, 3 and 4 bytes, so pieces meet them mid-way
TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/shop/orders/tasks.py", line 42, in charge\n'
    "    gateway.charge(order)\n"
    '  File "/srv/shop/payments/gateway.py", line 118, in charge\n'
    '    raise CardDeclined(f"card ending {card.last4} was declined")\n'
    "CardDeclined: la carte de Zoë (€ 12,50 🛒) a été refusée " + "é" * 40 + "\n"
)


def pieces(mq: EchoMQ, job_id: str, queue: str = "q") -> list[bytes]:
    key = mq.keys.job(queue, job_id)
    n = int(mq.client.hget(key, "error.n") or 1)
    fields = ["error", *(f"error.{i}" for i in range(2, n + 1))]
    return mq.client.hmget(key, fields)


def encoding(mq: EchoMQ, job_id: str, queue: str = "q") -> str:
    return mq.client.object("encoding", mq.keys.job(queue, job_id)).decode()


def test_a_long_error_is_kept_in_pieces_and_the_row_stays_a_listpack(tmq) -> None:
    tmq.enqueue("q", "x", {"n": 1}, job_id="j")
    kill(tmq, "j", TRACEBACK)
    parts = pieces(tmq, "j")
    assert len(parts) == int(raw_row(tmq, "q", "j")["error.n"]) > 1
    assert all(0 < len(p) <= PIECE for p in parts)
    assert [p.decode() for p in parts]  # no piece cuts a character
    assert b"".join(parts).decode() == TRACEBACK
    assert encoding(tmq, "j") == "listpack"
    assert tmq.get_job("q", "j").error == TRACEBACK
    # the same row holding its error whole is a hashtable, and dearer
    whole = {**raw_row(tmq, "q", "j"), "error": TRACEBACK}
    for f in [f for f in whole if f.startswith("error.")]:
        del whole[f]
    scratch = "emq:{q}:scratch"
    tmq.client.hset(scratch, mapping=whole)
    assert tmq.client.object("encoding", scratch) == b"hashtable"
    key = tmq.keys.job("q", "j")
    small, whole = (tmq.client.memory_usage(k, samples=0) for k in (key, scratch))
    assert small < 0.8 * whole, (small, whole)


def test_a_short_error_and_a_very_long_one_are_kept_whole(tmq) -> None:
    tmq.enqueue("q", "x", {}, job_id="short")
    tmq.enqueue("q", "x", {}, job_id="long")
    kill(tmq, "short", "b" * PIECE)
    huge = "x" * (PIECE * 24 + 1)  # past 24 pieces (1.5 KB) pieces cost more than they save
    kill(tmq, "long", huge)
    for job_id, error in (("short", "b" * PIECE), ("long", huge)):
        r = raw_row(tmq, "q", job_id)
        assert (r["error"], "error.n" in r) == (error, False), job_id
        assert tmq.get_job("q", job_id).error == error


def test_a_new_error_replaces_every_piece_and_a_retry_drops_them(tmq) -> None:
    tmq.enqueue("q", "x", {}, job_id="j", max_attempts=2, backoff_ms=0)
    job = claim_one(tmq, "q", "j")
    assert tmq.fail(job, TRACEBACK) is JobState.PENDING
    assert int(raw_row(tmq, "q", "j")["error.n"]) > 1
    kill(tmq, "j", "boom")
    assert [f for f in raw_row(tmq, "q", "j") if f.startswith("error")] == ["error"]
    assert tmq.get_job("q", "j").error == "boom"
    tmq.enqueue("q", "x", {}, job_id="k")
    kill(tmq, "k", TRACEBACK)
    tmq.retry("q", "k")
    assert [f for f in raw_row(tmq, "q", "k") if f.startswith("error")] == []
    assert tmq.get_job("q", "k").error is None


def test_a_replayed_fail_with_a_long_error_is_recognised(tmq) -> None:
    tmq.enqueue("q", "x", {}, job_id="j", max_attempts=2, backoff_ms=0)
    job = claim_one(tmq, "q", "j")
    assert tmq.fail(job, TRACEBACK) is JobState.PENDING
    assert tmq.fail(job, TRACEBACK) is JobState.PENDING  # the same lease and error: a replay
    assert_state(tmq, "q", "j", "pending")


def test_a_parent_and_every_reader_get_the_whole_error(tmq) -> None:
    """A child's death carries the whole error to its parent's :failed (here
    and through the outbox), an adopted dead child too; get_flow, get_job
    and the admin mirror join the pieces."""
    from echomq_django.runners.pump import Pump

    tmq.add_flow(node("p", [leaf("c"), leaf("x", queue="o")]))
    kill(tmq, "c", TRACEBACK)
    kill(tmq, "x", TRACEBACK, queue="o")
    Pump(["o"], mq=tmq).sweep()
    assert tmq.dependencies("q", "p").failed == {
        jref("c"): TRACEBACK,
        jref("x", "o"): TRACEBACK,
    }
    tree = tmq.get_flow("q", "p")
    assert {c["id"]: c["error"] for c in tree["children"]} == {"c": TRACEBACK, "x": TRACEBACK}
    row = tmq.client.hgetall(tmq.keys.job("q", "c"))
    assert job_from_row(tmq, "q", "c", row, datetime.now(UTC)).error == TRACEBACK
    # a dead child a flow added again takes back tells the new parent its
    # death: r's removal went a budget at a time and its process died before
    # it reached d
    flow = node("r", [leaf("e1"), leaf("e2"), leaf("d")])
    tmq.add_flow(flow)
    tmq.claim("q", 2)  # e1 and e2 run: d is the head
    assert tmq.fail_many([(claim_one(tmq, "q", "d"), TRACEBACK, True)])[0].state is JobState.DEAD
    lifecycle = type(tmq.lifecycle)
    follow_up = lifecycle._follow_up
    lifecycle._follow_up = lambda *a, **kw: None
    try:
        tmq.remove("q", "r", budget=2)  # e1 and e2 run (orphaned); d is not reached
    finally:
        lifecycle._follow_up = follow_up
    assert tmq.add_flow(flow).skipped == 3  # e1, e2 and d, taken back
    assert tmq.dependencies("q", "r").failed == {jref("d"): TRACEBACK}
    assert_state(tmq, "q", "r", "dead")


# -- pieces meeting multibyte characters; a parent revived ---------------------


def decoding_twin(client):
    """The same rig, with decode_responses=True."""
    if isinstance(client, RedisCluster):
        n = client.get_default_node()
        return RedisCluster(host=n.host, port=n.port, decode_responses=True)
    kw = client.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], decode_responses=True)


BOUNDARY_ERRORS = [pad * "a" + ch * 40 for ch in ("é", "€", "🛒") for pad in range(58, 66)] + [
    "a" * 63 + "é",
    "a" * 64 + "é",
    "€" * 22,
    "🛒" * 17,
    "x" * 65,
    "x" * 1536,
]


@pytest.mark.parametrize("error", BOUNDARY_ERRORS, ids=lambda e: f"{len(e.encode())}B")
def test_multibyte_errors_at_piece_boundaries_come_back_whole(tmq, error) -> None:
    tmq.enqueue("q", "x", {}, job_id="j")
    kill(tmq, "j", error)
    r = tmq.client.hgetall(tmq.keys.job("q", "j"))
    assert (
        all(len(v) <= 64 for f, v in r.items() if f.startswith(b"error"))
        or len(error.encode()) > 64 * 24
    )
    assert tmq.get_job("q", "j").error == error
    assert tmq.get_flow("q", "j")["error"] == error
    twin = EchoMQ(decoding_twin(tmq.client), prefix="emq", clock=tmq.clock)
    assert twin.get_job("q", "j").error == error
    assert twin.get_flow("q", "j")["error"] == error


def test_a_parent_revived_by_reattach_keeps_no_piece_of_its_error(tmq) -> None:
    long_line = "ValueError: " + "z" * 200  # the parent's 'failed by child' error is long
    tmq.add_flow(node("p", [leaf("c")]))
    kill(tmq, "c", long_line)
    assert "error.n" in raw_row(tmq, "q", "p")
    tmq.retry("q", "c")
    assert [f for f in raw_row(tmq, "q", "p") if f.startswith("error")] == []
    complete(tmq, "c", 1)
    assert_state(tmq, "q", "p", "pending")
    assert tmq.get_job("q", "p").error is None
