"""Durable signals under faults, on both rigs, with real processes:
a worker SIGKILLed right after its transitions, a dispatcher SIGKILLed in the
middle of a batch, and Redis SIGKILLed and restarted from its append-only
file. Each test asserts the exact signals the receivers saw."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow
from echomq_django.protocol.signal_events import SIGNAL_OF
from echomq_django.runners.dispatcher import Dispatcher
from echomq_django.testing import redis_server as devserver
from tests.support import rigs
from tests.support.eventkit import Seen, stream
from tests.support.jobkit import complete, kill, leaf, node
from tests.support.workerkit import wait_for

ROOT = Path(__file__).resolve().parents[2]
ALL = list(SIGNAL_OF)
pytestmark = pytest.mark.e2e


@pytest.fixture
def mq(redis_client) -> EchoMQ:
    return EchoMQ(redis_client, prefix="emq")


def rig_url(mq) -> tuple[str, str]:
    c = mq.client
    if isinstance(c, RedisCluster):
        node_ = c.get_primaries()[0]
        return f"redis://{node_.host}:{node_.port}/0", "1"
    kw = c.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}", "0"


def child(mq, *args: str) -> int:
    """Run ``python -m tests.support.eventkit`` against the test's rig; its exit code."""
    url, cluster = rig_url(mq)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.eventkit", args[0], url, cluster, *args[1:]],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
    return proc.returncode


def test_a_worker_killed_right_after_its_transitions_still_gets_its_signals_sent_once(mq, seen):
    mq.signal_events.subscribe(["q"], ALL)
    mq.add_flow(node("p", [leaf("a")]))
    assert child(mq, "worker") == -signal.SIGKILL
    assert mq.get_job("q", "a").state == "completed"
    # released by a's completion; the dying worker's loop may already have
    # claimed it (a release wakes the queue at once), never more
    assert mq.get_job("q", "p").state in ("pending", "active")
    assert seen.pairs() == []  # the worker died before sending anything
    Dispatcher(["q"], mq=mq).dispatch_all()
    assert seen.pairs() == [("job_completed", "a"), ("parent_released", "p")]
    assert seen.got[0][2]["result"] == {"id": "a"}


def test_a_dispatcher_killed_mid_batch_sends_the_rest_after_restart_with_the_same_ids(mq):
    mq.signal_events.subscribe(["q"], ALL)
    mq.add_flows([Flow("q", "leaf", {}, job_id=f"j{i}") for i in range(7)])
    for i in range(7):
        complete(mq, f"j{i}", i)
    ids = [f"q:{e[0]}" for e in stream(mq)]
    assert child(mq, "dispatch", "5", "3") == -signal.SIGKILL  # dies after 3 of a batch of 5
    lock = mq.keys.queue_key("q", "signals:lock")
    wait_for(lambda: not mq.client.exists(lock), what="the dead dispatcher's lock to expire")
    assert child(mq, "dispatch", "5", "0") == 0
    sent = [s.decode().split(" ") for s in mq.client.lrange("seen", 0, -1)]
    assert sent == [["job_completed", ids[i], f"j{i}"] for i in (0, 1, 2, *range(7))]
    assert stream(mq) == []


def _aof_server(cluster: bool) -> rigs.RedisProcess:
    srv = rigs.start_server(cluster=cluster)
    c = srv.client()
    if cluster:
        c.execute_command("CLUSTER ADDSLOTSRANGE", 0, 16383)
        wait_for(lambda: rigs.cluster_state(c) == "ok", what="a one-node cluster")
    c.config_set("appendfsync", "always")
    c.config_set("appendonly", "yes")
    wait_for(
        lambda: (
            (p := c.info("persistence"))["aof_enabled"] == 1
            and p["aof_rewrite_in_progress"] == 0
            and p["aof_rewrite_scheduled"] == 0
        ),
        what="the append-only file to be on",
    )
    c.close()
    return srv


def _restart(srv: rigs.RedisProcess) -> rigs.RedisProcess:
    srv.proc.send_signal(signal.SIGKILL)  # a crash: no shutdown save
    srv.proc.wait(timeout=10)
    args = [*srv.proc.args, "--appendonly", "yes", "--appendfsync", "always"]
    proc = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
    )
    devserver._live.add(proc)
    again = rigs.RedisProcess(port=srv.port, dir=srv.dir, proc=proc)
    c = again.client(socket_timeout=1)
    wait_for(lambda: _answers(c), what="redis-server to come back")
    c.close()
    return again


def _answers(c) -> bool:
    try:
        return c.ping() and c.info("persistence")["loading"] == 0
    except redis.RedisError:
        return False


@pytest.mark.parametrize("cluster", [False, True], ids=["single", "cluster"])
def test_no_event_is_lost_when_redis_restarts_from_its_append_only_file(cluster):
    srv = _aof_server(cluster)
    seen = Seen()
    try:

        def connect():
            if cluster:
                return RedisCluster(host=rigs.HOST, port=srv.port)
            return redis.Redis(host=rigs.HOST, port=srv.port)

        mq = EchoMQ(connect(), prefix="emq")
        mq.signal_events.subscribe(["q"], ALL)
        mq.add_flow(node("p", [leaf("a"), leaf("b", ignore_dependency_on_failure=True)]))
        complete(mq, "a", 1)
        kill(mq, "b", "boom")
        before = stream(mq)
        assert [e[1:3] for e in before] == [("completed", "a"), ("dead", "b"), ("released", "p")]
        mq.client.close()
        srv = _restart(srv)
        mq = EchoMQ(connect(), prefix="emq")
        assert stream(mq) == before
        Dispatcher(["q"], mq=mq).dispatch_all()
        assert seen.pairs() == [("job_completed", "a"), ("job_dead", "b"), ("parent_released", "p")]
        assert seen.ids() == [f"q:{e[0]}" for e in before]
        mq.client.close()
    finally:
        seen.close()
        srv.stop()
