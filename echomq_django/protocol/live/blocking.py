"""Blocking reads: for async callers each on a thread of its own
(docs/howto/wait.md#many-waiters-in-one-process), and a block longer than
the client's socket timeout (``long_block``, docs/howto/wait.md#what-a-wait-costs).

``asyncio.to_thread`` and ``sync_to_async`` share the event loop's default
executor, a few threads (``min(32, cpus + 4)``). A wait or an events step
holds its thread for as long as it blocks (seconds, or until an event
comes), so a handful of open follows there would hold up every other
``await`` of the process. A thread per blocking call costs about 50 µs to
start and is bounded by what the caller awaits at once (each also holds
one Redis connection of the client's pool).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from typing import Any

import redis

from ..errors import unblocked


async def off_loop(fn: Callable[..., Any], *args: Any, name: str = "echomq-blocking") -> Any:
    """``fn(*args)`` on a new daemon thread, awaited without blocking the
    event loop; its return value, or its exception raised here. A cancelled
    await does not stop the thread: ``fn`` must end by itself (each of ours
    blocks for one socket-timeout slice at most and checks a flag the
    caller sets on cancel)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(value: Any, err: BaseException | None) -> None:
        if done.cancelled():
            return
        if err is not None:
            done.set_exception(err)
        else:
            done.set_result(value)

    def run() -> None:
        try:
            value, err = fn(*args), None
        except BaseException as exc:  # handed to the awaiting coroutine
            value, err = None, exc
        try:
            loop.call_soon_threadsafe(settle, value, err)
        except RuntimeError:
            pass  # the loop closed meanwhile: nobody awaits this any more

    threading.Thread(target=run, name=name, daemon=True).start()
    return await done


# Redis's answers that the key is served elsewhere or not yet: MOVED, ASK
# (AskError), TRYAGAIN, CLUSTERDOWN and MASTERDOWN (ClusterDownError)
MOVED_ON = (
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
)
READ_MARGIN_S = 2.0  # a long block's reply is awaited this much past the block (s)


class Cancel:
    """A wait's cancel flag that also cuts the block it is in: ``set()``
    (from any thread) marks it and shuts down the socket the wait blocks on,
    so the wait ends at once with ``TimeoutError`` instead of at its block's
    end. ``await_result`` passes one; a plain ``threading.Event`` works too,
    by blocking one socket-timeout slice at a time.

    ``set()`` never closes the socket: a close from another thread frees
    its descriptor while the wait's thread is about to poll it, the next
    connection opened takes the same number, and the wait then blocks (up to
    its 300 s) on that other connection's socket, or reads its replies. A
    shutdown wakes the read at once; the wait's own thread closes the
    socket (``long_block``'s ``disconnect``)."""

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._lock = threading.Lock()
        self._conn = None

    def is_set(self) -> bool:
        """Whether ``set()`` was called."""
        return self._flag.is_set()

    def set(self) -> None:
        """Mark the wait cancelled and shut down the socket it blocks on, if any."""
        with self._lock:
            self._flag.set()
            # a cached client's connection wraps the real one (CacheProxyConnection)
            conn = getattr(self._conn, "_conn", self._conn)
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # closed meanwhile by the wait's thread: nothing to cut

    def hold(self, conn) -> bool:
        """Note ``conn`` as the one the wait blocks on (None: it blocks on
        none any more); False when already cancelled (then do not block)."""
        with self._lock:
            self._conn = conn if not self._flag.is_set() else None
            return not self._flag.is_set()


def long_block(
    client, key: str, commands: list[tuple], block_s: float, cancel: Cancel | None = None
) -> list | None:
    """Send ``commands`` (tuples of a command's words; the first one blocks
    on Redis up to ``block_s`` s, the others ride behind it) on one
    connection of ``client``'s pool (a Cluster's: the pool of the node that
    holds ``key``) and return their parsed replies, each read with a
    timeout of ``block_s + READ_MARGIN_S`` instead of the pool's socket
    timeout: one block may outlast it, so a waiter costs two commands per
    block, not per socket-timeout slice (docs/howto/wait.md#what-a-wait-costs).

    Returns None when this path cannot serve (a lost connection, a read that
    timed out, a Cluster slot that moved, a client without a pool): the
    caller then sends the same commands the ordinary way, with the client's
    retries and routing. The connection is dropped, not reused, after any
    error. Errors Redis answers for a command (``ResponseError``) are raised,
    but for ``-UNBLOCKED`` (``unblocked``): None.
    ``cancel.set()`` from another thread shuts its socket down: None."""
    try:
        if hasattr(client, "get_node_from_key"):  # a RedisCluster
            client = client.get_node_from_key(key).redis_connection
        pool, callbacks = client.connection_pool, client.response_callbacks
    except (AttributeError, redis.RedisError):
        return None
    conn = pool.get_connection()  # connecting, it retries as the client does
    try:
        if cancel is not None and not cancel.hold(conn):
            return None
        conn.send_packed_command(conn.pack_commands(commands))
        if cancel is not None and cancel.is_set():
            # set() between hold() and the send: whatever it found to cut,
            # this block is not read
            conn.disconnect()
            return None
        replies = []
        for words in commands:
            reply = conn.read_response(timeout=block_s + READ_MARGIN_S)
            name = str(words[0]).upper()
            replies.append(callbacks[name](reply) if name in callbacks else reply)
        return replies
    except (redis.ConnectionError, redis.TimeoutError, OSError):
        conn.disconnect()
        return None
    except MOVED_ON:  # the client's routing follows it (redis-py strips the word)
        conn.disconnect()  # the later replies are unread
        return None
    except redis.ResponseError as err:
        conn.disconnect()  # the later replies are unread
        if unblocked(err):
            return None
        raise
    except Exception:
        conn.disconnect()
        if cancel is not None and cancel.is_set():
            return None  # the cut ended the read under the parser
        raise
    except BaseException:
        conn.disconnect()
        raise
    finally:
        if cancel is not None:
            cancel.hold(None)  # set() cuts this connection no more
            if cancel.is_set():  # it may have cut it after the last read
                conn.disconnect()  # not handed on with a socket shut down
        pool.release(conn)
