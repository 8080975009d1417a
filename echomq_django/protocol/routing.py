"""Script calls on a Redis Cluster, each sent to the master of its first key's slot.

docs/explanation/protocol.md#one-slot-per-script: all of a script's keys share
one slot, so the host routes a call by its first key, with no ``COMMAND
GETKEYS`` round trip. ``send`` writes the calls for each master packed by
hiredis onto one of that master's pooled connections, all masters' writes
before any read, as the one-server own write does
(docs/explanation/performance.md#the-scripts-own-write); a call that could not
be sent that way, or whose reply says it did not run there (``MOVED``,
``ASK``, ``TRYAGAIN``, ``CLUSTERDOWN``, ``READONLY``, a connection that
failed), goes through redis-py's ``ClusterPipeline``, with the slot map
refreshed before each resend (``ROUTE_ATTEMPTS``).

A ``call`` is ``(name, keys, args)``; ``Loads`` gives its script's SHA1 and
text and knows on which masters this client loaded it: the own write sends
a script's ``SCRIPT LOAD`` ahead of its first call on a master, in the same
write (docs/explanation/performance.md#a-workers-start).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable

import redis
from redis.crc import key_slot

from .errors import TRANSIENT

try:  # the [fast] extra: a call's packing in C
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - the extra is optional
    _pack = None

# Cluster pipelines: sends of the calls a failover interrupted, the slot map
# refreshed before each resend (a promotion takes the cluster-node-timeout and
# an election: seconds), and the pause before a resend.
ROUTE_ATTEMPTS = 3
ROUTE_PAUSE_S = 0.1
# how long (ms) a master's WAIT for one replica may take before the calls it
# ran count as not yet safe (Scripts.run_many_confirmed)
REPLICA_WAIT_MS = 500
MAP_ERRORS = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
# replies saying the slot map is out of date (MOVED is an AskError)
ROUTING = (
    redis.exceptions.AskError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
)
_UNREAD = object()  # a reply not read (a script may answer nil)


def connection_from(pool):
    """A connection taken from redis-py's ``pool`` (a ``ConnectionPool``); raises what
    its ``get_connection`` raises. redis-py 5.0 requires a command's name there (and
    never reads it); later versions make it optional, then deprecate passing one."""
    return pool.get_connection(*_name_argument(type(pool)))


@functools.cache
def _name_argument(pool_type: type) -> tuple:
    try:
        param = inspect.signature(pool_type.get_connection).parameters.get("command_name")
    except (TypeError, ValueError):  # not introspectable: the current signature
        return ()
    return ("EVALSHA",) if param is not None and param.default is param.empty else ()


def packs_as(encoder) -> bool:
    """Whether hiredis' packing writes a ``str`` as ``encoder`` (a redis-py
    client's ``Encoder``) does: UTF-8, strict. A client set to another
    encoding keeps redis-py's own path, so a key is the same bytes either way."""
    codec = str(getattr(encoder, "encoding", "")).lower().replace("-", "").replace("_", "")
    return codec == "utf8" and getattr(encoder, "encoding_errors", "strict") == "strict"


Call = tuple[str, list, list]


class Loads:
    """The scripts one Cluster client loaded on each master (by node name,
    ``host:port``), so that the own write sends a script's ``SCRIPT LOAD``
    ahead of its first call on a master, in the same write, and no sooner:
    a client loads nothing ahead, and no script it never runs
    (docs/explanation/performance.md#a-workers-start). A master that lost its
    scripts (a restart, a failover, ``SCRIPT FLUSH``) answers ``NOSCRIPT``,
    and the caller sends those calls again with ``send(..., reload=True)``,
    whose loads mark them loaded again; a load refused (an ACL without
    ``SCRIPT LOAD``) is not sent again, as on one server. ``sha_of(name)``
    and ``text_of(name)`` give a script's SHA1 and its source (str).
    Thread-safe as the caller's threads use it: the worst a race costs is a
    load sent twice."""

    def __init__(self, sha_of: Callable[[str], str], text_of: Callable[[str], str]) -> None:
        self.sha_of, self.text_of = sha_of, text_of
        self._on: dict[str, set[str]] = {}

    def needed(self, master: str, names) -> list[str]:
        """The distinct script names among ``names`` not loaded on ``master``, in order."""
        have = self._on.get(master, ())
        return [name for name in dict.fromkeys(names) if name not in have]

    def loaded(self, master: str, names) -> None:
        """Mark the script names ``names`` as sent to ``master`` with a ``SCRIPT LOAD``."""
        self._on.setdefault(master, set()).update(names)


def send(
    client,
    loads: Loads,
    calls: list[Call],
    confirmed: list[bool],
    after: str | None,
    packs: bool = True,
    reload: bool = False,
) -> list:
    """Send ``calls`` (a ``RedisCluster``'s); returns the raw replies in order
    (an error object for a refused call, a transient one for a call that
    never got through). With ``after`` (a key), each master with a replica
    that a call wrote to, other than ``after``'s, is sent ``WAIT 1
    REPLICA_WAIT_MS`` behind its calls on the same connection, and
    ``confirmed[i]`` (bool) is set False for a call whose master's WAIT
    counted no replica. ``loads``: the client's ``Loads`` (the own write
    loads a script on a master with its first call there, or with every
    call when ``reload`` (calls a master answered ``NOSCRIPT``); the pipeline
    loads none). ``packs``: ``packs_as`` of the client's encoder (False:
    every call through the pipeline)."""
    slots = [key_slot(client.encoder.encode(keys[0])) for _, keys, _ in calls]
    skip = None if after is None else key_slot(client.encoder.encode(after))
    replies: list = [None] * len(calls)
    todo = list(range(len(calls)))
    if _pack is not None and packs:
        todo, refresh = _written(client, loads, calls, slots, skip, replies, confirmed, reload)
        if refresh:
            try:
                client.nodes_manager.initialize()  # the pipeline's first send goes by the new map
            except MAP_ERRORS:
                pass  # still failing over: the pipeline refreshes it again between its sends
    if todo:
        _pipelined(client, loads.sha_of, calls, slots, skip, replies, confirmed, todo)
    return replies


def _written(
    client, loads, calls, slots, skip, replies, confirmed, reload=False
) -> tuple[list[int], bool]:
    """The own write: every master's calls (and its WAIT) packed into one send on
    one pooled connection of it, the ``SCRIPT LOAD`` of each script not yet loaded
    there ahead of them (``Loads``; of every call's script with ``reload``), then
    every master's replies read back. Fills
    ``replies`` (and ``confirmed``); returns the indices left to the pipeline
    (calls not sent, not answered: the connection failed and was closed, never
    reused, or answered with a ``TRANSIENT`` error), and whether the slot map
    should be refreshed first (a connection failed, or a master answered that
    the slot is not its). Raises what is not transient, every connection it
    took closed and given back."""
    try:
        targets = {i: client.nodes_manager.get_node_from_slot(s) for i, s in enumerate(slots)}
        packed = [_pack(("EVALSHA", loads.sha_of(n), len(k), *k, *a)) for n, k, a in calls]
    except (*MAP_ERRORS, TypeError):  # no master in the map; an argument hiredis refuses
        return list(range(len(calls))), False
    waits = {node.name for node in replica_waits(client, targets, slots, skip)}
    groups: dict[str, list[int]] = {}
    for i, node in targets.items():
        groups.setdefault(node.name, []).append(i)
    got = [_UNREAD] * len(calls)
    left: set[int] = set()
    refresh = False
    held: dict[int, tuple] = {}  # id(connection) -> (pool, connection): not given back yet
    try:
        sent = []  # (connection, master, indices, scripts loaded ahead, waited)
        for name, idx in groups.items():
            pool = getattr(targets[idx[0]].redis_connection, "connection_pool", None)
            if pool is None:  # not connected yet: redis-py's own path connects it
                left.update(idx)
                continue
            names = (calls[i][0] for i in idx)
            need = list(dict.fromkeys(names)) if reload else loads.needed(name, names)
            data = b"".join(
                [*(_pack(("SCRIPT", "LOAD", loads.text_of(n))) for n in need)]
                + [packed[i] for i in idx]
            )
            if name in waits:
                data += _pack(("WAIT", 1, REPLICA_WAIT_MS))
            try:
                conn = connection_from(pool)  # gives back what it made, if it fails
                held[id(conn)] = (pool, conn)
                conn.send_packed_command([data], check_health=False)
            except TRANSIENT:  # a master that cannot be reached: its calls resent
                left.update(idx)
                refresh = True
                continue
            sent.append((conn, name, idx, need, name in waits))
        for conn, name, idx, need, waited in sent:
            try:
                for _ in need:
                    try:
                        conn.read_response()
                    except redis.exceptions.ResponseError:  # refused: its calls say NOSCRIPT
                        pass
                loads.loaded(name, need)
                for i in idx:
                    try:
                        got[i] = conn.read_response()
                    except redis.exceptions.ResponseError as err:
                        got[i] = err
                if waited:
                    try:
                        n = conn.read_response()
                    except redis.exceptions.ResponseError:  # a master demoted meanwhile
                        n = 0
                    for i in idx:
                        confirmed[i] = isinstance(n, int) and n >= 1
            except TRANSIENT:  # replies left unread: the connection is never reused
                left.update(i for i in idx if got[i] is _UNREAD)
                refresh = True
                for i in idx if waited else ():  # ran, not known to be on a replica: kept
                    confirmed[i] = False
                continue
            pool, _ = held.pop(id(conn))
            pool.release(conn)
    finally:
        for pool, conn in held.values():  # unread, or interrupted: closed, then given back
            conn.disconnect()
            pool.release(conn)
    for i, reply in enumerate(got):
        if isinstance(reply, TRANSIENT):
            left.add(i)
            refresh = refresh or isinstance(reply, ROUTING)
        elif i not in left:
            replies[i] = reply
    return sorted(left), refresh


def _pipelined(client, sha_of, calls, slots, skip, replies, confirmed, todo) -> None:
    """Send the calls ``todo`` (indices) through a ``ClusterPipeline``, each
    to the master of its slot, and resend those a failover interrupted, up to
    ``ROUTE_ATTEMPTS`` sends, the slot map refreshed before each resend; fills
    ``replies`` and ``confirmed``."""
    for attempt in range(ROUTE_ATTEMPTS):
        if attempt:
            time.sleep(ROUTE_PAUSE_S)
            try:
                client.nodes_manager.initialize()  # the new map, and a live default node
            except MAP_ERRORS:
                continue  # the cluster is still failing over: try again after a pause
        try:
            pipe = client.pipeline(transaction=False)
            targets = {}
            for i in todo:
                name, keys, args = calls[i]
                node = client.nodes_manager.get_node_from_slot(slots[i])
                targets[i] = node
                # ClusterPipeline blocks .evalsha(): the raw command, to its node
                pipe.execute_command(
                    "EVALSHA", sha_of(name), len(keys), *keys, *args, target_nodes=node
                )
            waits = replica_waits(client, targets, slots, skip)
            for node in waits:  # after its calls: WAIT counts this connection's writes
                pipe.execute_command("WAIT", 1, REPLICA_WAIT_MS, target_nodes=node)
            got = pipe.execute(raise_on_error=False)
        except TRANSIENT as err:
            for i in todo:
                replies[i] = err
            continue
        acked = {
            node.name: isinstance(n, int) and n >= 1
            for node, n in zip(waits, got[len(todo) :], strict=True)
        }
        for i, reply in zip(todo, got, strict=False):
            replies[i] = reply
            confirmed[i] = acked.get(targets[i].name, True)
        todo = [i for i in todo if isinstance(replies[i], TRANSIENT)]
        if not todo:
            break


def replica_waits(client, targets: dict, slots: list[int], skip: int | None) -> list:
    """The distinct masters among ``targets`` (call index -> node) that
    have a replica in the slot map and are not the master of slot ``skip``
    (None: no WAIT at all), in first-call order."""
    if skip is None:
        return []
    cache = client.nodes_manager.slots_cache
    try:
        skipped = client.nodes_manager.get_node_from_slot(skip).name
    except MAP_ERRORS:
        skipped = None  # its slot has no master in the map now: every target waits
    nodes: dict[str, object] = {}
    for i, node in targets.items():
        if node.name != skipped and len(cache.get(slots[i]) or ()) > 1:
            nodes.setdefault(node.name, node)
    return list(nodes.values())
