"""A wait's long block (protocol/live/blocking.py ``long_block``,
docs/howto/wait.md#what-a-wait-costs) under what a hostile deployment does to
it: a slot migrated away, a killed connection, a cancel at each edge of the
block, many waiters at once. Each wait still gets the job's result (or its
own cancel), and the client's pool is left whole: no connection leaked, none
handed back with a reply still owed on it."""

from __future__ import annotations

import threading

import pytest
import redis
from redis.backoff import ConstantBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from echomq_django import EchoMQ
from echomq_django.protocol.live.blocking import Cancel
from tests.support import rigs
from tests.support.workerkit import wait_for
from tests.test_wait import NEVER, Waiter, finish, registered


def _blocked(client: redis.Redis, name: str | None = None) -> list[dict]:
    """The server's clients blocked in an XREAD (CLIENT LIST); with ``name``,
    only the connections of that client name (the Cluster rig is shared by
    the session: another test's reader may still be blocked on a master)."""
    return [
        c
        for c in client.client_list()
        if c["cmd"] == "xread" and "b" in c["flags"] and name in (None, c["name"])
    ]


def _node(cluster: RedisCluster, port: int):
    return next(n for n in cluster.get_primaries() if n.port == port)


def _move_slot(cluster: RedisCluster, slot: int, source: int, target: int) -> None:
    """Migrate ``slot`` with its keys from the master on port ``source`` to
    the one on ``target`` (CLUSTER SETSLOT IMPORTING / MIGRATING, MIGRATE,
    SETSLOT NODE on every master)."""
    src = _node(cluster, source).redis_connection
    dst = _node(cluster, target).redis_connection
    src_id, dst_id = src.cluster("MYID"), dst.cluster("MYID")
    dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
    src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
    keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)
    if keys:
        src.execute_command("MIGRATE", rigs.HOST, target, "", 0, 5000, "KEYS", *keys)
    for node in cluster.get_primaries():
        node.redis_connection.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)


MOVED_WAIT = "emq-test-moved-wait"  # the client name of the migrated wait's connections


def test_a_slot_migrated_away_from_a_blocked_wait_is_followed(rc, redis_cluster) -> None:
    # Redis answers a client blocked on a key of a migrated slot -MOVED
    # (redis-py: MovedError, its message without the word); the wait sends
    # its next block the ordinary way, which follows the slot
    own = RedisCluster(host=rigs.HOST, port=redis_cluster.ports[0], client_name=MOVED_WAIT)
    mq = EchoMQ(own, prefix="emq")
    done = mq.keys.queue("q").done("mv")
    slot = rc.keyslot(done)
    source = redis_cluster.master_port(done)
    target = next(p for p in redis_cluster.ports if p != source)
    mq.enqueue("q", "t.echo", None, job_id="mv")
    waiter = Waiter(mq, "q", "mv", NEVER)
    registered(mq, "q", "mv", 1)
    src = _node(rc, source).redis_connection
    wait_for(lambda: len(_blocked(src, MOVED_WAIT)) == 1, what="the wait blocked")
    _move_slot(rc, slot, source, target)
    try:
        dst = _node(rc, target).redis_connection
        moved = lambda: len(_blocked(dst, MOVED_WAIT)) == 1 or not waiter.thread.is_alive()  # noqa: E731
        wait_for(moved, what="the wait blocked on the slot's new master")
        assert waiter.error is None
        assert _blocked(src, MOVED_WAIT) == []
        finish(mq, "q", "moved")
        assert waiter.join().result == "moved"
    finally:
        _move_slot(rc, slot, target, source)  # the session's rig as it was
        own.close()


def _client(r: redis.Redis, **kwargs) -> redis.Redis:
    """A client of its own on the test's server (``r``'s host and port)."""
    kw = r.connection_pool.connection_kwargs
    return redis.Redis(host=kw["host"], port=kw["port"], **kwargs)


def test_a_cancel_shuts_the_socket_down_and_leaves_its_close_to_the_wait(r) -> None:
    # set() runs on another thread (the event loop's) than the wait's read:
    # a close there frees the descriptor under the read, and the next socket
    # opened (another wait's reconnect) gets the same number, which the read
    # then polls: seen as a cancelled wait blocked on for up to 300 s
    pool = r.connection_pool
    conn = pool.get_connection()
    try:
        cancel = Cancel()
        assert cancel.hold(conn)
        sock = conn._sock
        cancel.set()
        assert conn._sock is sock and sock.fileno() != -1  # still the wait's descriptor
        assert sock.recv(1) == b""  # shut down: a read there ends at once
        assert not cancel.hold(conn)  # and the wait does not block again
    finally:
        conn.disconnect()
        pool.release(conn)
    assert r.echo("after") == b"after"


class _CancelledBeforeHold(Cancel):
    """A ``Cancel`` set by another party just before the wait holds its
    connection (after the loop's top found it unset)."""

    def hold(self, conn) -> bool:
        if conn is not None:
            self.set()
        return super().hold(conn)


def test_a_cancel_before_the_hold_sends_no_block_and_a_late_one_cuts_nothing(r) -> None:
    client = _client(r, socket_timeout=None)
    mq = EchoMQ(client, prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="early")
    r.config_resetstat()
    cancel = _CancelledBeforeHold()
    with pytest.raises(TimeoutError, match="was cancelled"):
        mq.wait("q", "early", NEVER, cancel=cancel)
    assert r.info("commandstats").get("cmdstat_xread") is None  # no block sent
    # the wait's connection now serves another user: a late set() leaves it be
    conn = client.connection_pool.get_connection()
    try:
        cancel.set()
        conn.send_command("ECHO", "still mine")
        assert conn.read_response(timeout=2) == b"still mine"
    finally:
        client.connection_pool.release(conn)
    _pool_whole(client)


class _CancelledAfterTheReads(Cancel):
    """A ``Cancel`` set by another party after the block's replies were
    read, before the wait lets go of its connection."""

    def hold(self, conn) -> bool:
        if conn is None:
            self.set()
        return super().hold(conn)


def test_a_cancel_after_the_last_read_leaves_no_cut_socket_in_the_pool(r) -> None:
    from echomq_django.protocol.live.blocking import long_block

    client = _client(r, retry=Retry(NoBackoff(), 0))  # a cut socket would fail a command
    assert long_block(client, "k", [("ECHO", "read")], 1.0, _CancelledAfterTheReads()) == [b"read"]
    (conn,) = client.connection_pool._available_connections
    assert conn._sock is None  # closed by the wait's thread, to be opened anew
    assert client.echo("next") == b"next"
    _pool_whole(client)


def _pool_whole(client: redis.Redis) -> None:
    """No connection of ``client``'s pool is still held, and each idle one
    answers its own command (none owes an earlier command's reply)."""
    pool = client.connection_pool
    own = {client.connection} - {None}  # a single_connection_client holds its one
    wait_for(lambda: pool._in_use_connections <= own, what="every connection given back")
    held = [pool.get_connection() for _ in range(len(pool._available_connections))]
    try:
        for i, conn in enumerate(held):
            conn.send_command("ECHO", f"mine-{i}")
            assert conn.read_response(timeout=2) in (f"mine-{i}", f"mine-{i}".encode())
    finally:
        for conn in held:
            pool.release(conn)


class _CancelledOnHold(Cancel):
    """A ``Cancel`` set by another party the moment the wait notes its
    connection: the cancel that lands between ``hold`` and the block's send."""

    def hold(self, conn) -> bool:
        held = super().hold(conn)
        if conn is not None and held:
            threading.Thread(target=self.set).start()
            threading.Event().wait(0.05)  # the set() is done before the send
        return held


def test_a_cancel_between_hold_and_send_still_cuts_the_block(r) -> None:
    # set() drops the held connection before anything is sent on it; the
    # send must not connect it again and block there (up to 300 s) unseen
    client = _client(r, socket_timeout=None)
    mq = EchoMQ(client, prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="race")
    waiter = Waiter(mq, "q", "race", NEVER, cancel=_CancelledOnHold())
    waiter.thread.join(5)
    assert not waiter.thread.is_alive(), "the cancelled wait blocks on"
    with pytest.raises(TimeoutError, match="was cancelled"):
        waiter.join()
    wait_for(lambda: _blocked(r) == [], what="no XREAD left blocked")
    _pool_whole(client)


def test_killed_blocks_leave_the_pool_whole(r) -> None:
    # each round: 4 waits block, their connections are killed (CLIENT KILL
    # TYPE normal), they block again, the jobs finish
    client = _client(r, socket_timeout=None, max_connections=6)
    mq = EchoMQ(client, prefix="emq")
    me = r.client_id()
    for n in range(5):
        ids = [f"k{n}-{i}" for i in range(4)]
        for i in ids:
            mq.enqueue("q", "t.echo", i, job_id=i)
        waiters = [Waiter(mq, "q", i, NEVER) for i in ids]
        wait_for(lambda: len(_blocked(r)) == 4, what="4 waits blocked")
        for c in _blocked(r):
            r.client_kill_filter(_id=c["id"])
        wait_for(lambda: len(_blocked(r)) == 4, what="4 waits blocked again")
        assert me not in [c["id"] for c in _blocked(r)]
        for _ in ids:
            (job,) = mq.claim("q")
            mq.complete(job, job.payload)
        assert sorted(w.join().result for w in waiters) == ids
    _pool_whole(client)
    assert client.get("nothing") is None and client.echo("after") == b"after"


def test_many_cancelled_awaits_end_their_waits_at_once(r, monkeypatch) -> None:
    import asyncio

    import echomq_django as emq
    from echomq_django.api import calls as api

    client = _client(r, socket_timeout=None)  # only the cut ends a block
    mq = EchoMQ(client, prefix="emq")
    monkeypatch.setattr(api, "get_mq", lambda: mq)
    mq.enqueue("q", "t.echo", None, job_id="many")

    async def run():
        # before, during, after the block starts; 20 at once, whose connections
        # (re)open while the others' are cut: a closed descriptor is reused
        for delay in (0, 0.001, 0.003, 0.01, 0.03) * 3:
            tasks = [asyncio.create_task(emq.await_result("q", "many", NEVER)) for _ in range(20)]
            await asyncio.sleep(delay)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with pytest.raises(asyncio.CancelledError):
                    await task

    asyncio.run(run())
    wait_for(
        lambda: not [t for t in threading.enumerate() if t.name == "echomq-wait"],
        timeout=5,
        what="every cancelled wait's thread ended",
    )
    wait_for(lambda: _blocked(r) == [], what="no XREAD left blocked")
    _pool_whole(client)
    finish(mq, "q", "still")
    assert mq.wait("q", "many", 5).result == "still"


@pytest.mark.e2e  # 3-5 s: each waiter's mark wakes every waiter before it
def test_two_hundred_waits_on_one_client_all_wake(r) -> None:
    client = _client(r, socket_timeout=1.0, max_connections=260)
    mq = EchoMQ(client, prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="crowd")
    waiters = [Waiter(mq, "q", "crowd", 30) for _ in range(200)]
    # (the done stream keeps about DONE_MAXLEN entries: count the blocked)
    wait_for(lambda: len(_blocked(r)) == 200, what="200 waits blocked")
    finish(mq, "q", "all")
    assert [w.join().result for w in waiters] == ["all"] * 200
    _pool_whole(client)


@pytest.mark.parametrize("way", ["long_block", "ordinary"])
def test_a_block_unblocked_with_an_error_goes_on(r, way) -> None:
    # CLIENT UNBLOCK <id> ERROR answers the XREAD -UNBLOCKED, as a master
    # demoted to a replica (REPLICAOF) does to all its
    # blocked clients: the block ended, the job did not. A wait given a
    # threading.Event blocks the ordinary way (a pipeline), never long_block.
    client = _client(r, socket_timeout=None)
    mq = EchoMQ(client, prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="u")
    cancel = threading.Event() if way == "ordinary" else None
    waiter = Waiter(mq, "q", "u", NEVER, cancel=cancel)
    wait_for(lambda: len(_blocked(r)) == 1, what="the wait blocked")
    (first,) = _blocked(r)
    assert r.client_unblock(first["id"], error=True)  # at once: no longer blocked
    wait_for(lambda: _blocked(r) or not waiter.thread.is_alive(), what="blocked again")
    assert waiter.error is None
    finish(mq, "q", "on")
    assert waiter.join().result == "on"
    _pool_whole(client)


def test_a_master_demoted_under_a_blocked_wait_answers_it_once_promoted_again() -> None:
    server = rigs.start_server()
    client = redis.Redis(host=rigs.HOST, port=server.port)
    admin = server.client()
    try:
        mq = EchoMQ(client, prefix="emq")
        mq.enqueue("q", "t.echo", None, job_id="d")
        waiter = Waiter(mq, "q", "d", NEVER)
        wait_for(lambda: len(_blocked(admin)) == 1, what="the wait blocked")
        admin.replicaof(rigs.HOST, rigs.free_port())  # a master that never answers
        wait_for(
            lambda: (
                not admin.client_list(_type="replica")
                and admin.info("replication")["role"] == "slave"
            ),
            what="demoted",
        )
        wait_for(
            lambda: len(_blocked(admin)) == 1 or not waiter.thread.is_alive(),
            what="blocked on the replica",
        )
        assert waiter.error is None
        admin.replicaof("NO", "ONE")
        finish(EchoMQ(admin, prefix="emq"), "q", "promoted")
        assert waiter.join().result == "promoted"
        _pool_whole(client)
    finally:
        client.close()
        admin.close()
        server.stop()


def test_waits_blocked_across_server_restarts_get_their_results() -> None:
    # the AOF keeps the jobs and their done streams across a SIGKILL; the
    # client's retries (2 s) ride out each restart (about 0.1 s here)
    from echomq_django.testing.redis_server import restart

    server = rigs.start_server(options={"appendonly": "yes", "appendfsync": "always"})
    client = redis.Redis(
        host=rigs.HOST, port=server.port, socket_timeout=0.5, retry=Retry(ConstantBackoff(0.05), 40)
    )
    admin = server.client()  # reconnects by itself after each restart
    try:
        mq = EchoMQ(client, prefix="emq")
        ids = [f"re{i}" for i in range(6)]
        for i in ids:
            mq.enqueue("q", "t.echo", i, job_id=i)
        waiters = [Waiter(mq, "q", i, NEVER) for i in ids]
        for _ in range(2):
            wait_for(lambda: len(_blocked(admin)) == 6, what="6 waits blocked")
            server.proc.kill()
            server.proc.wait(5)
            server = restart(server)
        wait_for(lambda: len(_blocked(admin)) == 6, what="6 waits blocked again")
        for _ in ids:
            (job,) = mq.claim("q")
            mq.complete(job, job.payload)
        assert sorted(w.join().result for w in waiters) == ids
        _pool_whole(client)
    finally:
        client.close()
        admin.close()
        server.stop()


@pytest.mark.e2e
def test_a_wait_blocked_through_a_sentinel_failover_gets_the_result(no_env_url) -> None:
    # SENTINEL FAILOVER demotes the master the wait blocks on, and kills
    # its clients (CLIENT KILL TYPE normal): the wait blocks again on the new
    from echomq_django.conf import build_client
    from tests.support import sentinelkit

    rig = sentinelkit.start_sentinel_rig()
    try:
        cfg = {"SENTINELS": rig.sentinels, "MASTER_NAME": sentinelkit.MASTER_NAME}
        mq = EchoMQ(build_client(cfg), prefix="emq")
        mq.enqueue("s", "t.echo", None, job_id="sf")
        waiter = Waiter(mq, "s", "sf", NEVER)
        registered(mq, "s", "sf", 1)
        old = redis.Redis(host=rigs.HOST, port=rig.master_port())
        wait_for(lambda: len(_blocked(old)) == 1, what="the wait blocked on the master")
        new = rig.failover()
        assert waiter.error is None
        finish(EchoMQ(build_client(cfg), prefix="emq"), "s", "failed over")
        assert waiter.join().result == "failed over"
        assert new != old.connection_pool.connection_kwargs["port"]
        old.close()
    finally:
        rig.stop()


def test_a_wait_on_a_stalled_server_ends_near_its_timeout_not_a_block_later() -> None:
    # DEBUG SLEEP stalls the server past the block's read (block + 2 s): the
    # block sent again the ordinary way lasted what was left before the
    # stall, 1.5 s past the wait's timeout here
    import time

    server = rigs.start_server(options={"enable-debug-command": "yes"})
    client = redis.Redis(host=rigs.HOST, port=server.port, socket_timeout=None)
    admin = server.client()
    try:
        mq = EchoMQ(client, prefix="emq")
        mq.enqueue("q", "t.echo", None, job_id="st")
        start = time.monotonic()
        waiter = Waiter(mq, "q", "st", 1.5)
        wait_for(lambda: len(_blocked(admin)) == 1, what="the wait blocked")
        admin.execute_command("DEBUG", "SLEEP", 3.7)
        waiter.thread.join(10)
        took = time.monotonic() - start
        with pytest.raises(TimeoutError, match="did not finish in 1.5 s"):
            waiter.join()
        assert 3.7 <= took < 4.5  # the stall, not the stall and the block again (5.2 s)
    finally:
        client.close()
        admin.close()
        server.stop()


@pytest.mark.parametrize(
    "options",
    [
        {"protocol": 2},
        {"protocol": 3},
        {"decode_responses": True},
        {"protocol": 3, "decode_responses": True},
        {"single_connection_client": True},
        {"health_check_interval": 1},
    ],
    ids=["resp2", "resp3", "decoded", "resp3-decoded", "single-connection", "health-check"],
)
def test_each_kind_of_client_waits_through_a_killed_block(r, options) -> None:
    client = _client(r, socket_timeout=0.5, **options)
    mq = EchoMQ(client, prefix="emq")
    mq.enqueue("q", "t.echo", None, job_id="kind")
    waiter = Waiter(mq, "q", "kind", NEVER)
    wait_for(lambda: len(_blocked(r)) == 1, what="the wait blocked")
    threading.Event().wait(1.2)  # past the socket timeout and a health check's interval
    (first,) = _blocked(r)
    r.client_kill_filter(_id=first["id"])
    wait_for(lambda: [c["id"] for c in _blocked(r)] not in ([], [first["id"]]), what="again")
    finish(mq, "q", {"kind": list(options)})
    assert waiter.join().result == {"kind": list(options)}
    assert client.echo("after") in ("after", b"after")
    _pool_whole(client)
    client.close()


def test_a_block_a_failover_ends_is_not_now_for_a_follow_and_a_waker(r, caplog) -> None:
    """``-UNBLOCKED`` (what a master demoted by a failover answers every
    blocked client; here ``CLIENT UNBLOCK ... ERROR``) is "not now" on every
    blocking path, as a dropped connection is: a follow of the events raises
    ``RedisUnavailable`` and resumes after its last event, and a worker's
    wake thread logs one WARNING, no ERROR and no traceback, and blocks again."""
    import logging

    from echomq_django import RedisUnavailable
    from echomq_django.runners import wake
    from echomq_django.runners.wake import Waker

    client = _client(r, socket_timeout=None)
    mq = EchoMQ(client, prefix="emq")
    follow = mq.events(["q"], block_s=30)
    follow.start()  # from now
    mq.enqueue("q", "t.echo", None, job_id="e1")
    assert next(follow).job_id == "e1"
    got = []
    reader = threading.Thread(target=lambda: got.append(_step(follow)), daemon=True)
    reader.start()
    # the follow blocks in slices: unblock whichever slice is blocked now
    wait_for(
        lambda: any(r.client_unblock(c["id"], error=True) for c in _blocked(r)),
        what="the follow's block ended by UNBLOCKED",
    )
    reader.join(10)
    assert isinstance(got[0], RedisUnavailable) and "UNBLOCKED" in str(got[0])
    mq.enqueue("q", "t.echo", None, job_id="e2")
    assert next(follow).job_id == "e2"  # its place kept: e1 is not given again

    posted = []
    r.delete(mq.keys.queue("q").wake)  # the adds' marker: the waker finds none and blocks
    waker = Waker(mq, ["q"], "wake", posted.append, block_s=30)
    with caplog.at_level(logging.WARNING, logger="echomq_django.wake"):
        waker.start()
        waker.arm()
        zpop = lambda: [  # noqa: E731
            c for c in r.client_list() if c["cmd"] == "bzpopmin" and "b" in c["flags"]
        ]
        wait_for(
            lambda: any(r.client_unblock(c["id"], error=True) for c in zpop()),
            what="the waker's block ended by UNBLOCKED",
        )
        wait_for(lambda: posted and zpop(), what="down, and blocked again")
        mq.enqueue("q", "t.echo", None, job_id="e3")  # its marker ends the block
        wait_for(lambda: len(posted) == 3, what="up, and the wake-up")
        waker.stop()
    assert posted[:2] == [wake.DOWN, wake.UP] and posted[2].queue == "q"
    assert [rec.levelname for rec in caplog.records] == ["WARNING"]
    assert "UNBLOCKED" in caplog.records[0].getMessage() and not caplog.records[0].exc_info


def _step(follow):
    """The follow's next event, or the exception its step raised."""
    try:
        return next(follow)
    except Exception as err:
        return err
