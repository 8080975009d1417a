"""Operator commands to running workers (``mq.commands``, runners/control/commands.py,
docs/howto/operate-workers.md), on both rigs: a worker hears a command on the
blocking read it already makes (idle) or on its command key alone (busy),
acknowledges it, and applies it; a command for an unknown worker is refused
naming the live ones, nothing written; a worker that never reads its
commands holds a bounded, expiring key."""

from __future__ import annotations

import json
import threading
import time

import pytest
import redis

from echomq_django import JobState, Worker, handler
from echomq_django.protocol.control import commands as proto
from echomq_django.protocol.presence import ProcessInfo
from tests.support.workerkit import Background, wait_for

RELEASE = threading.Event()


@handler("cmd.block")
def block(job):
    """Waits until the test releases it (at most 20 s)."""
    RELEASE.wait(20)
    return "released"


@handler("cmd.nap")
def nap(job):
    """Sleeps ``payload`` seconds (a child process cannot see ``RELEASE``)."""
    time.sleep(job.payload)
    return "rested"


@pytest.fixture(autouse=True)
def _released():
    RELEASE.clear()
    yield
    RELEASE.set()


def start(mq, **kw) -> tuple[Worker, Background]:
    kw.setdefault("concurrency", 2)
    worker = Worker(["cq", "cq2"], mq=mq, block_timeout=0.5, beat_s=0.2, **kw)
    bg = Background(worker)
    wait_for(lambda: any(p.id == worker.process_id for p in mq.presence.live_processes()),
             what="the worker listed")  # fmt: skip
    wait_for(lambda: worker.waiting, what="the worker idle")
    return worker, bg


def fake_worker(mq, worker_id="ghost:1:abc") -> ProcessInfo:
    """A listed worker that never reads its commands."""
    now = mq.clock()
    info = ProcessInfo(worker_id, "worker", "ghost", 1, ["cq"], now, now, now, "emq")
    mq.presence.beat(info, 60)
    return info


def test_an_idle_worker_grows_and_shrinks_its_pool_and_replies(mq) -> None:
    worker, bg = start(mq)
    try:
        [(cid, wid)] = mq.commands.send("pool-grow", 3, worker=worker.process_id)
        assert wid == worker.process_id
        row = mq.commands.wait(cid, 10)
        # a fixed pool of 2 grows to at most twice its size
        assert (row["state"], row["detail"]) == ("done", "2 -> 4 handlers (bounded by 1-4)")
        assert (row["command"], row["n"], row["worker"]) == ("pool-grow", 3, worker.process_id)
        assert worker.loop.concurrency == 4
        assert worker.loop.pool.size == 4
        [(cid, _)] = mq.commands.send("pool-shrink", 1, worker=worker.process_id)
        assert mq.commands.wait(cid, 10)["detail"] == "4 -> 3 handlers"
        assert worker.loop.concurrency == 3
        states = [e[1][b"state"] for e in mq.client.xrange(mq.keys.command(cid))]
        assert states == [b"sent", b"acknowledged", b"done"]
        # the heartbeat carries the new size to the live-workers page
        listed = lambda: [p.concurrency for p in mq.presence.live_processes()  # noqa: E731
                          if p.id == worker.process_id]  # fmt: skip
        wait_for(lambda: listed() == [3], what="the new size listed")
        assert worker.loop.commands.applied["pool-grow"] == 1
    finally:
        worker.stop()
        bg.join()


def test_a_busy_worker_hears_drain_finishes_its_jobs_and_claims_no_more(mq) -> None:
    for i in range(3):
        mq.enqueue("cq", "cmd.block", {}, job_id=f"b{i}")
    worker = Worker(["cq", "cq2"], mq=mq, concurrency=2, block_timeout=0.5, beat_s=0.2)
    bg = Background(worker)
    wait_for(lambda: len(worker.loop.claims) == 2, what="both handlers busy")
    wait_for(lambda: worker.loop.idle.waker._listening, what="the waker on the command key")
    [(cid, _)] = mq.commands.send("drain", worker=worker.process_id)
    row = mq.commands.wait(cid, 10, until=("acknowledged",))
    assert (row["state"], row["detail"]) == ("acknowledged", "drain: no more claims")
    assert bg.thread.is_alive()
    RELEASE.set()
    bg.join()
    assert [mq.get_job("cq", f"b{i}").state for i in range(3)] == [
        JobState.COMPLETED,
        JobState.COMPLETED,
        JobState.PENDING,  # never claimed after the drain
    ]
    assert mq.commands.record(cid)["state"] == "done"
    assert mq.commands.record(cid)["detail"] == "stopped"


def test_a_busy_worker_goes_back_to_its_markers_and_leaves_no_key_without_a_ttl(mq) -> None:
    mq.enqueue("cq", "cmd.block", {}, job_id="long")
    worker = Worker(["cq", "cq2"], mq=mq, concurrency=1, block_timeout=0.5, beat_s=0.2)
    bg = Background(worker)
    waker = None
    try:
        wait_for(lambda: worker.loop.idle.waker and worker.loop.idle.waker._listening,
                 what="the waker on the command key")  # fmt: skip
        waker = worker.loop.idle.waker
        RELEASE.set()
        wait_for(lambda: worker.waiting and not waker._listening, what="idle, on the markers")
        mq.enqueue("cq2", "cmd.nap", 0, job_id="next")
        wait_for(lambda: mq.get_job("cq2", "next").state == JobState.COMPLETED, what="next job")
        key = mq.keys.queue("cq").commands(worker.process_id)
        assert mq.client.pttl(key) != -1  # gone (the nudge was popped), or expiring
    finally:
        worker.stop()
        bg.join()
    assert worker.loop.commands.applied == dict.fromkeys(proto.COMMANDS, 0)


def test_shutdown_stops_an_idle_worker_and_it_leaves_the_list(mq) -> None:
    _, bg = start(mq)
    [(cid, _)] = mq.commands.send("shutdown", all_workers=True)
    assert bg.join() == 0
    assert mq.commands.record(cid)["state"] == "done"
    assert mq.presence.live_processes() == []


def test_a_command_for_an_unknown_worker_is_refused_naming_the_live_ones(mq) -> None:
    fake_worker(mq, "ghost:1:abc")
    with pytest.raises(ValueError) as err:
        mq.commands.send("drain", worker="nope:2:def")
    assert str(err.value) == "unknown worker id 'nope:2:def'; live workers: ghost:1:abc"
    assert mq.commands.recent() == []
    assert mq.client.zcard(mq.keys.queue("cq").commands("ghost:1:abc")) == 0
    assert mq.client.exists(mq.keys.queue("cq").commands("nope:2:def")) == 0


@pytest.mark.parametrize(
    ("name", "n", "error"),
    [
        (
            "reboot",
            None,
            "unknown command 'reboot': one of shutdown, drain, pool-grow, pool-shrink",
        ),
        ("pool-grow", 0, "pool-grow takes N, a whole number of handlers 1-10000, got 0"),
        ("pool-shrink", None, "pool-shrink takes N, a whole number of handlers 1-10000, got None"),
        ("drain", 2, "drain takes no N, got 2"),
    ],
)
def test_bad_commands_are_refused_before_any_write(mq, name, n, error) -> None:
    fake_worker(mq)
    with pytest.raises(ValueError) as err:
        mq.commands.send(name, n, worker="ghost:1:abc")
    assert str(err.value) == error
    assert mq.commands.recent() == []


def test_naming_neither_or_both_targets_is_refused(mq) -> None:
    fake_worker(mq)
    for kw in ({}, {"worker": "ghost:1:abc", "all_workers": True}):
        with pytest.raises(ValueError, match="name one worker id, or all workers"):
            mq.commands.send("drain", **kw)
    mq.presence.leave("ghost:1:abc")
    with pytest.raises(ValueError, match="^no worker is running$"):
        mq.commands.send("drain", all_workers=True)


def test_commands_a_worker_never_reads_are_capped_and_expire(mq) -> None:
    info = fake_worker(mq)
    for _ in range(proto.PENDING_KEPT + 20):
        mq.commands.send("pool-grow", 1, worker=info.id)
    key = mq.commands.pending_key(info)
    assert mq.client.zcard(key) == proto.PENDING_KEPT
    assert 0 < mq.client.pttl(key) <= proto.PENDING_TTL_MS
    # the newest are the ones kept
    kept = [json.loads(m)["id"] for m in mq.client.zrange(key, 0, -1)]
    sent = [r["id"] for r in mq.commands.recent(limit=proto.PENDING_KEPT)]
    assert sorted(kept) == sorted(sent)
    for _ in range(proto.RECENT_KEPT):
        mq.commands.send("drain", worker=info.id)
    assert mq.client.zcard(mq.keys.command_index()) == proto.RECENT_KEPT
    assert 0 < mq.client.ttl(mq.keys.command(sent[0])) <= proto.RECORD_TTL_S


def test_a_command_read_too_late_is_replied_expired_and_not_applied(mq) -> None:
    worker, bg = start(mq)
    try:
        cid = "1-old"
        mq.client.xadd(mq.keys.command(cid), {"state": "sent", "command": "shutdown", "n": "",
                                              "worker": worker.process_id, "at": 1})  # fmt: skip
        member = json.dumps({"id": cid, "c": "shutdown", "n": None})
        sent_at = mq.clock() - proto.PENDING_TTL_MS
        mq.client.zadd(mq.keys.queue("cq").commands(worker.process_id), {member: sent_at})
        row = mq.commands.wait(cid, 10)
        assert (row["state"], row["detail"]) == (
            "expired",
            "it waited too long to be read; not applied",
        )
        assert bg.thread.is_alive() and not worker.loop.stopping.is_set()
    finally:
        worker.stop()
        bg.join()


def test_autoscale_bounds_a_resize(mq) -> None:
    worker, bg = start(mq, autoscale=(3, 1))
    try:
        [(cid, _)] = mq.commands.send("pool-grow", 5, worker=worker.process_id)
        assert mq.commands.wait(cid, 10)["detail"] == "1 -> 3 handlers (bounded by 1-3)"
        [(cid, _)] = mq.commands.send("pool-shrink", 9, worker=worker.process_id)
        assert mq.commands.wait(cid, 10)["detail"] == "3 -> 1 handlers (bounded by 1-3)"
    finally:
        worker.stop()
        bg.join()


@pytest.mark.e2e
def test_the_process_pool_grows_and_drains_on_command(mq) -> None:
    worker, bg = start(mq, pool="process", concurrency=1)
    [(cid, _)] = mq.commands.send("pool-grow", 1, worker=worker.process_id)
    assert mq.commands.wait(cid, 10)["detail"] == "1 -> 2 handlers"
    wait_for(lambda: len(worker.loop.pool.pids()) == 2, what="a second child")
    mq.enqueue("cq2", "cmd.nap", 3.0, job_id="p1")
    wait_for(lambda: len(worker.loop.claims) == 1, what="the job running")
    [(cid, _)] = mq.commands.send("drain", worker=worker.process_id)
    # acknowledged while the job runs; on a slow machine the worker may hear
    # it only as the job ends, and both replies then come in one read
    first = mq.commands.wait(cid, 10, until=("acknowledged", "done"))["state"]
    assert first in ("acknowledged", "done")
    bg.join()
    assert mq.get_job("cq2", "p1").state == JobState.COMPLETED  # a drain lets it finish
    assert mq.commands.record(cid)["state"] == "done"


def control(*args: str) -> tuple[int, str]:
    """``manage.py echomq_control ARGS``: (exit code, stdout or the error)."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    out = io.StringIO()
    try:
        call_command("echomq_control", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, str(exc)
    return 0, out.getvalue()


def test_echomq_control_resizes_a_worker_and_prints_its_reply(r) -> None:
    from echomq_django.conf import get_mq

    mq = get_mq()
    worker, bg = start(mq)
    try:
        code, out = control("pool-grow", "1", "--worker", worker.process_id)
        assert (code, out) == (0, f"{worker.process_id}: pool-grow done: 2 -> 3 handlers\n")
        code, out = control("drain", "--all", "--wait", "5")
        assert (code, out) == (0, f"{worker.process_id}: drain done: stopped\n")
        bg.join()
    finally:
        worker.stop()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (
            ("drain", "--worker", "nope:1:x"),
            "unknown worker id 'nope:1:x'; live workers: ghost:1:abc",
        ),
        (("pool-grow", "--all"), "pool-grow needs N, the number of handlers"),
        (
            ("pool-shrink", "0", "--all"),
            "pool-shrink takes N, a whole number of handlers 1-10000, got 0",
        ),
        (
            ("shutdown", "--all", "--wait", "-1"),
            "--wait must be a number of seconds from 0 to 86,400 (a day), got -1.0",
        ),
        (
            ("pool-shrink", "1", "--all", "--wait", "inf"),
            "--wait must be a number of seconds from 0 to 86,400 (a day), got inf",
        ),
        (
            ("drain", "--all", "--wait", "nan"),
            "--wait must be a number of seconds from 0 to 86,400 (a day), got nan",
        ),
    ],
)
def test_echomq_control_refuses_bad_input_in_one_line_sending_nothing(r, args, error) -> None:
    from echomq_django.conf import get_mq

    mq = get_mq()
    fake_worker(mq)
    assert control(*args) == (1, f"echomq_control: {error}")
    assert mq.commands.recent() == []


def test_echomq_control_refuses_an_unknown_command_in_one_line(r) -> None:
    assert control("restart", "--all") == (
        1,
        "echomq_control: unknown command 'restart': one of shutdown, drain, pool-grow, pool-shrink",
    )


def test_echomq_control_wait_0_sends_and_exits_0(r) -> None:
    from echomq_django.conf import get_mq

    mq = get_mq()
    fake_worker(mq)
    assert control("pool-grow", "1", "--all", "--wait", "0") == (0, "ghost:1:abc: pool-grow sent\n")
    assert [row["state"] for row in mq.commands.recent()] == ["sent"]


def test_a_wait_longer_than_the_client_socket_timeout_blocks_in_steps(r, redis_server) -> None:
    """Each XREAD BLOCK ends before the client's socket timeout (0.5 s
    here), so a 1.5 s wait for a worker that does not reply answers its
    row, not a read timeout taken for Redis being away."""
    from echomq_django import EchoMQ

    mq = EchoMQ(redis.Redis.from_url(redis_server, socket_timeout=0.5))
    fake_worker(mq)
    [(cid, _)] = mq.commands.send("drain", all_workers=True)
    started = time.monotonic()
    assert mq.commands.wait(cid, 1.5)["state"] == "sent"
    assert time.monotonic() - started >= 1.4


def test_echomq_control_exits_1_while_a_drain_is_only_acknowledged(r, monkeypatch) -> None:
    """A drain the worker acknowledged but has not finished (its jobs still
    run) is not done: the line says acknowledged, and the exit is 1."""
    from echomq_django.conf import get_mq

    mq = get_mq()
    fake_worker(mq)
    send = type(mq.commands).send

    def send_and_acknowledge(self, *args, **kwargs):
        sent = send(self, *args, **kwargs)
        for cid, _ in sent:
            self.reply(cid, ("acknowledged", "drain: no more claims"))
        return sent

    monkeypatch.setattr(type(mq.commands), "send", send_and_acknowledge)
    code, out = control("drain", "--all", "--wait", "0.2")
    assert code == 1
    assert out == (
        "echomq_control: 1 of 1 workers had not done drain within 0.2s (a command waits "
        "for its worker up to 10 minutes; a drain ends when its jobs do)"
    )


def test_echomq_control_says_which_workers_did_not_reply(r) -> None:
    from echomq_django.conf import get_mq

    mq = get_mq()
    fake_worker(mq)
    code, out = control("shutdown", "--all", "--wait", "0.2")
    assert (code, out) == (
        1,
        "echomq_control: 1 of 1 workers had not done shutdown within 0.2s (a command waits "
        "for its worker up to 10 minutes; a drain ends when its jobs do)",
    )


@pytest.mark.cluster
def test_a_commands_record_is_written_before_a_worker_can_pop_it(rc) -> None:
    """On a Cluster the record and the worker's key sit on different nodes:
    the record's ``sent`` must be in Redis before the command can be popped
    (a worker replying first left the record reading ``sent`` for good). The
    other masters hold writes 300 ms as each command is sent; the popper
    reads its node's clock at each pop, which must not come before the
    record's entry (six sends: at least one record on another node but for
    odds of 3**-6)."""
    import echomq_django

    mq = echomq_django.EchoMQ(rc, prefix="emq")
    info = fake_worker(mq)
    key = mq.commands.pending_key(info)
    home = rc.get_node_from_key(key)
    others = [n for n in rc.get_primaries() if n.name != home.name]
    popper = redis.Redis(host=home.host, port=home.port)
    pops: list[int] = []

    def pop_six():
        for _ in range(6):
            if popper.bzpopmin(key, timeout=10) is None:
                return
            sec, usec = popper.time()
            pops.append(sec * 1000 + usec // 1000)

    thread = threading.Thread(target=pop_six)
    thread.start()
    cids = []
    try:
        for _ in range(6):
            for node in others:
                rc.execute_command("CLIENT", "PAUSE", 300, "WRITE", target_nodes=node)
            [(cid, _)] = mq.commands.send("pool-grow", 1, worker=info.id)
            cids.append(cid)
        thread.join(30)
    finally:
        popper.close()
    recorded = [int(rc.xrange(mq.keys.command(c))[0][0].decode().split("-")[0]) for c in cids]
    assert len(pops) == 6
    assert [r <= p for r, p in zip(recorded, pops, strict=True)] == [True] * 6
    assert {mq.commands.record(c)["state"] for c in cids} == {"sent"}
