"""The script loader: loads ``lua/`` once per process, runs scripts by EVALSHA.

docs/explanation/protocol.md#one-script-per-transition. Each ``lua/<name>.lua`` is one transition; a
line ``-- @include lib/<file>.lua`` in its body is replaced by that file (shared
fan-in code; a lib file may include another, each is inlined once). The text
is read once per process (``load_sources``); each client gets redis-py
``Script`` objects (EVALSHA with the NOSCRIPT fallback), and one server a
pipeline of EVALSHAs with the loads they need ahead (``Scripts.run_many``).

The header of each file declares its ``KEYS[i]`` and ``ARGV[i]``; ``run``
checks every call against it, so Python and Lua cannot drift apart silently.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from ..core.keyspace import absent_key
from . import routing
from .errors import TRANSIENT, connection_error, translate

NoScriptError = redis.exceptions.NoScriptError
# a call that never ran: "not now" (_confirmed); redis-py's pipeline answers a call
# whose redirections ran out (a slot migrating) with ClusterError, as errors.AWAY has it
NOT_RUN = (*TRANSIENT, redis.exceptions.ClusterError, NoScriptError)

try:  # the [fast] extra: a call's packing in C (Scripts._written)
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - the extra is optional
    _pack = None

_INCLUDE = re.compile(r"^-- @include (\S+)$", re.MULTILINE)
_KEYS = re.compile(r"^\s+KEYS\[(\d+)\]\s+(.+)$", re.MULTILINE)
_ARGV = re.compile(r"^\s+ARGV\[(\d+)(\.\.)?\]\s+(.+)$", re.MULTILINE)


def lua_dir() -> Path:
    """The folder holding the Lua scripts: the top-level ``lua/`` beside the package in a
    checkout, the ``echomq_django/lua`` package data in an installed wheel. Raises
    ``FileNotFoundError`` when neither exists."""
    package = Path(__file__).resolve().parent.parent  # echomq_django/
    checkout = package.parent / "lua"
    if (checkout / "claim.lua").is_file():
        return checkout
    # The wheel maps lua/ to echomq_django/lua (pyproject package-dir), with no __init__.py:
    # importlib.resources would give a MultiplexedPath whose str() is not a path.
    packaged = package / "lua"
    if (packaged / "claim.lua").is_file():
        return packaged
    raise FileNotFoundError(
        f"echomq_django's Lua scripts are missing (looked in {checkout} "
        f"and {packaged}); reinstall the package"
    )


@dataclass(frozen=True)
class Source:
    """One script: its name, full text (includes inlined) and declared arity.

    ``nkeys`` is the number of ``KEYS[i]`` lines; ``nargv`` the number of fixed
    ``ARGV[i]`` lines; ``variadic`` is true when the header ends with
    ``ARGV[n..]`` (a repeated group).
    """

    name: str
    text: str
    header: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    variadic: bool

    nkeys = property(lambda self: len(self.keys))
    nargv = property(lambda self: len(self.argv))


def parse_header(name: str, raw: str) -> tuple[str, tuple[str, ...], tuple[str, ...], bool]:
    """Parse a script's ``--[[ ... ]]`` header into (header, keys, argv, variadic).

    Raises ``ValueError`` when the header is missing, numbers its KEYS/ARGV
    out of order, or lacks a ``returns:`` or ``errors:`` line.
    """
    if not raw.startswith("--[["):
        raise ValueError(f"lua/{name}.lua must open with a --[[ header ]]")
    header = raw[: raw.index("\n]]") + 3]  # the header closes with "]]" on its own line
    keys, argv, variadic = [], [], False
    for m in _KEYS.finditer(header):
        keys.append((int(m.group(1)), m.group(2).strip()))
    for m in _ARGV.finditer(header):
        if m.group(2):
            variadic = True
            continue
        argv.append((int(m.group(1)), m.group(3).strip()))
    for label, items in (("KEYS", keys), ("ARGV", argv)):
        if [i for i, _ in items] != list(range(1, len(items) + 1)):
            raise ValueError(f"lua/{name}.lua header numbers its {label} out of order")
    for word in ("returns:", "errors:"):
        if word not in header:
            raise ValueError(f"lua/{name}.lua header lacks a {word!r} line")
    return header, tuple(k for _, k in keys), tuple(a for _, a in argv), variadic


@functools.cache
def load_sources() -> dict[str, Source]:
    """Read every ``lua/*.lua`` once per process; returns ``{name: Source}``."""
    folder = lua_dir()
    sources = {}
    for path in sorted(folder.glob("*.lua")):
        raw, name = path.read_text(), path.stem
        header, keys, argv, variadic = parse_header(name, raw)
        sources[name] = Source(name, inline(folder, raw), header, keys, argv, variadic)
    return sources


def inline(folder: Path, raw: str, seen: set[str] | None = None) -> str:
    """``raw`` with each ``-- @include lib/<file>.lua`` line replaced by that
    file, itself inlined the same way (lib/flow.lua includes
    lib/claimable.lua); a file included twice is inlined once, at its first
    include, so its locals are defined once."""
    seen = set() if seen is None else seen

    def include(m: re.Match) -> str:
        if m.group(1) in seen:
            return ""
        seen.add(m.group(1))
        return inline(folder, (folder / m.group(1)).read_text(), seen)

    return _INCLUDE.sub(include, raw)


class Scripts:
    """The scripts bound to one client (``redis.Redis`` or ``RedisCluster``).

    ``run(name, keys, args)`` executes one script and returns its reply;
    ``run_many([(name, keys, args), ...])`` pipelines many in one round trip
    and returns their replies in order, an exception object in place of a
    failed one. ``EMQ...`` errors become named exceptions (exceptions.py); a
    connection error becomes ``RedisUnavailable`` naming the address.
    """

    def __init__(self, client: redis.Redis | RedisCluster) -> None:
        self.client = client
        self.sources = load_sources()
        self._scripts = {n: client.register_script(s.text) for n, s in self.sources.items()}
        self._loaded_for_pipeline = False  # a Cluster's without the own write: all, everywhere
        self._loaded: set[str] = set()  # one server's: the scripts loaded by a call's own trip
        # a Cluster's own write: the scripts loaded on each master, each by its first call there
        self._loads = routing.Loads(self._sha, lambda name: self._scripts[name].script)
        encoder = client.encoder if isinstance(client, RedisCluster) else client.get_encoder()
        self._packs = routing.packs_as(encoder)  # hiredis writes a str as the client would

    def check_call(self, name: str, keys: list, args: list) -> None:
        """Raise ``TypeError`` when a call does not match the script's header."""
        src = self.sources[name]
        fixed_ok = len(args) >= src.nargv if src.variadic else len(args) == src.nargv
        if len(keys) != src.nkeys or not fixed_ok:
            raise TypeError(
                f"script {name} takes {src.nkeys} KEYS and {src.nargv}"
                f"{'+' if src.variadic else ''} ARGV, got {len(keys)} and {len(args)}"
            )

    def run(self, name: str, keys: list, args: list):
        """Run script ``name``; raises the named exception for an ``EMQ`` error,
        ``RedisUnavailable`` for a transient one (``exceptions.TRANSIENT``)."""
        one_server = not isinstance(self.client, RedisCluster)
        fast = _pack if one_server else routing._pack
        if fast is not None or (one_server and name not in self._loaded):
            # the own write, or a first call: its load in the same round trip (on a
            # Cluster, on its master: routing.Loads), not every script first
            reply = self._confirmed([(name, keys, args)], None, load=one_server)[0][0]
            if isinstance(reply, Exception):
                raise reply
            return reply
        self.check_call(name, keys, args)
        if not one_server:
            keys = [*keys, absent_key(keys[0])]
        try:
            return self._scripts[name](keys=keys, args=args)
        except NOT_RUN as err:  # before ResponseError
            raise connection_error(self.client, err) from err  # NoScriptError: see _confirmed
        except redis.exceptions.ResponseError as err:
            raise translate(err) from None

    def run_after(self, ahead: list | None, calls: list) -> list:
        """``run_many`` of ``ahead`` (script calls, or None) then ``calls`` in one
        round trip; returns the replies of ``calls``, each of ``ahead`` replaced
        in place by its reply (an exception if refused). Raises as ``run_many``."""
        if not ahead:
            return self.run_many(calls)
        replies = self.run_many([*ahead, *calls])
        ahead[:] = replies[: len(ahead)]
        return replies[len(ahead) :]

    def run_many(self, calls: list[tuple[str, list, list]]) -> list:
        """Pipeline ``calls`` in one round trip (per node on a Cluster).

        Returns one reply per call, or the translated exception for a call that
        Redis refused (``EMQ...``); the others still ran. A NOSCRIPT call (a
        flushed, restarted or failed-over node) never ran: on one server those
        calls are sent again with their loads in one more round trip, on a
        Cluster one by one. Raises
        ``RedisUnavailable`` when a call could not run for a transient reason
        (``exceptions.TRANSIENT``: connection, failover, loading) even after
        the resends below; calls that did run are replays when the caller
        repeats the batch, which every script recognises.

        On a Cluster each call also declares its queue's ``absent`` key
        (``keyspace.absent_key``), so that no script starts while its slot
        migrates (docs/explanation/reliability.md#a-slot-moved-under-load),
        and is routed by the slot of its first key,
        computed here (all of a script's keys share it,
        docs/explanation/protocol.md#one-slot-per-script): no
        ``COMMAND GETKEYS`` round trip to redis-py's default node, which after
        a failover may be the dead master
        (docs/explanation/reliability.md#a-failover-heals-by-itself). Calls that a
        failover interrupted are re-sent, up to ``ROUTE_ATTEMPTS`` sends, with
        the slot map refreshed before each.
        """
        return self.run_many_confirmed(calls)[0]

    def run_many_confirmed(
        self, calls: list[tuple[str, list, list]], after_key: str | None = None
    ) -> tuple[list, list[bool]]:
        """``run_many``, and for a hand-off across Cluster masters: with
        ``after_key`` (str, the key whose record the caller deletes once these
        calls landed: an outbox), each master with a replica that a call wrote
        to, other than ``after_key``'s, is sent ``WAIT 1 REPLICA_WAIT_MS`` in
        the same pipeline, on the same connection. Returns ``(replies,
        confirmed)``: ``confirmed[i]`` (bool) is False when call ``i``'s
        master did not confirm a replica holds its writes within
        ``REPLICA_WAIT_MS`` ms (its record must stay: a failover now would
        take the writes back, replication being asynchronous). One server, or
        a master shared with ``after_key``, needs no WAIT: one replication
        stream keeps its writes in order, so a replica that holds the deletion
        holds the writes before it. An unconfirmed call refreshes the slot
        map (a replica the Cluster marked failed leaves it). Raises as
        ``run_many``.
        docs/explanation/reliability.md#a-hand-off-between-masters-waits-for-a-replica."""
        return self._confirmed(calls, after_key)

    def _confirmed(
        self, calls: list[tuple[str, list, list]], after_key: str | None, load: bool = True
    ):
        """``run_many_confirmed``'s work (``run`` takes it too: one round trip,
        counted once by whoever watches the public calls). On a Cluster without
        the own write (no ``hiredis``), every script is loaded ahead of the first
        pipeline (``_load_for_pipeline``), unless ``load`` is False; with it, a
        script rides ahead of its first call on each master (``routing.Loads``)."""
        if not calls:
            return [], []
        for name, keys, args in calls:
            self.check_call(name, keys, args)
        confirmed = [True] * len(calls)
        if isinstance(self.client, RedisCluster):
            # each declares its queue's absent key: refused, not begun, while the slot migrates
            calls = [(name, [*keys, absent_key(keys[0])], args) for name, keys, args in calls]
            own = routing._pack is not None and self._packs
            try:  # its SCRIPT LOAD on a fresh client meets a dead master too
                if load and not own:
                    self._load_for_pipeline()
                replies = routing.send(
                    self.client, self._loads, calls, confirmed, after_key, self._packs
                )
                again = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
                if own and again:  # a master lost them: sent again, their loads ahead, once
                    sub = [True] * len(again)
                    redo = routing.send(
                        self.client,
                        self._loads,
                        [calls[i] for i in again],
                        sub,
                        after_key,
                        self._packs,
                        reload=True,
                    )
                    for i, reply, ok in zip(again, redo, sub, strict=True):
                        replies[i], confirmed[i] = reply, ok
            except TRANSIENT as err:
                raise connection_error(self.client, err) from err
            if not all(confirmed):
                try:
                    self.client.nodes_manager.initialize()
                except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException):
                    pass  # still failing over: the next call refreshes it again
        else:
            try:
                replies = self._one_server(calls)
                again = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
                if again:  # flushed: loaded and sent again in order, in one trip (run_many)
                    self._loaded.difference_update(calls[i][0] for i in again)
                    redo = self._one_server([calls[i] for i in again])
                    for i, reply in zip(again, redo, strict=True):
                        replies[i] = reply
            except TRANSIENT as err:
                raise connection_error(self.client, err) from err
        out, cluster = [], isinstance(self.client, RedisCluster)
        for i, ((name, keys, args), reply) in enumerate(zip(calls, replies, strict=True)):
            if isinstance(reply, NoScriptError):  # a Cluster's, or flushed again: one by one
                if cluster and after_key is not None:
                    confirmed[i] = False  # run alone, with no WAIT behind it: not confirmed
                try:
                    reply = self._scripts[name](keys=keys, args=args)
                except redis.exceptions.ResponseError as err:
                    reply = err
                except TRANSIENT as err:
                    reply = err
            # NOSCRIPT again after its load: flushed meanwhile; it never ran, so "not now"
            if isinstance(reply, NOT_RUN):
                raise connection_error(self.client, reply) from reply
            if isinstance(reply, redis.exceptions.ResponseError):
                reply = translate(reply)
            out.append(reply)
        return out, confirmed

    def _one_server(self, calls: list[tuple[str, list, list]]) -> list:
        """One server: ``calls`` in one round trip, the loads they need ahead (``_to_load``);
        the raw replies in order (an error object in place of a refused call)."""
        replies = self._written(calls)
        if replies is None:  # sent through redis-py, with its retries
            pipe = self.client.pipeline(transaction=False)
            loads = self._to_load(calls)
            for name in loads:
                pipe.script_load(self._scripts[name].script)
            for name, keys, args in calls:
                # raw EVALSHA: a Script on a pipeline sends SCRIPT EXISTS first, a round
                # trip of its own at every execute; a NOSCRIPT reply is run again instead
                pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
            replies = pipe.execute(raise_on_error=False)
            self._loaded.update(loads)
            replies = replies[len(loads) :]
        return replies

    def _written(self, calls: list[tuple[str, list, list]]) -> list | None:
        """One server: ``calls`` as EVALSHAs packed by hiredis in one write on one pooled
        connection, their replies read back in order (an error reply in its place), without
        redis-py's pipeline: its per-argument encoding and bookkeeping were a third of a
        completion's Python (docs/explanation/performance.md#the-scripts-own-write). None
        without hiredis, or for an argument it does not pack: the caller sends the calls through
        redis-py (which names the argument), and for a client set to an encoding other than
        UTF-8 (``routing.packs_as``). A connection that fails under the calls is closed
        and its error raised, as redis-py's would be (the caller's ``RedisUnavailable``; a
        replay of calls that ran is recognised by every script)."""
        if _pack is None or not self._packs:
            return None
        loads = self._to_load(calls)
        try:
            packed = [_pack(("SCRIPT", "LOAD", self._scripts[n].script)) for n in loads]
            packed += [
                _pack(("EVALSHA", self._scripts[n].sha, len(k), *k, *a)) for n, k, a in calls
            ]
        except TypeError:  # None, a bool, a list: redis-py's pipeline names it
            return None
        pool = self.client.connection_pool
        conn = routing.connection_from(pool)
        try:
            conn.send_packed_command([b"".join(packed)], check_health=False)
            replies = []
            for _ in range(len(loads) + len(calls)):
                try:
                    replies.append(conn.read_response())
                except redis.exceptions.ResponseError as err:
                    replies.append(err)
        except BaseException:  # TRANSIENT: RedisUnavailable, as from redis-py's own call
            conn.disconnect()  # replies may be left unread: never reused
            raise
        finally:
            pool.release(conn)
        self._loaded.update(loads)
        return replies[len(loads) :]

    def _to_load(self, calls: list[tuple[str, list, list]]) -> list[str]:
        """One server: the scripts of ``calls`` not loaded by this client (since a NOSCRIPT),
        each once, their ``SCRIPT LOAD`` ahead of the calls in the same round trip: a worker's
        start waits for no load of its own (docs/explanation/performance.md#a-workers-start)."""
        return list(dict.fromkeys(n for n, _, _ in calls if n not in self._loaded))

    def _sha(self, name: str) -> str:
        return self._scripts[name].sha

    def _load_for_pipeline(self) -> None:
        """A Cluster without the own write (no ``hiredis``): every script loaded once per
        client before its first pipeline (one server: ``_to_load``; the own write:
        ``routing.Loads``); a server that lost them later (a restart, a failover, SCRIPT
        FLUSH) answers NOSCRIPT for each: ``_confirmed`` runs those again, loading them."""
        if not self._loaded_for_pipeline:
            for script in self._scripts.values():
                script.sha = self.client.script_load(script.script)
            self._loaded_for_pipeline = True


def socket_timeout(client) -> float | None:
    """The socket timeout (s) of ``client``'s connections, None for none: a
    blocking command must end before it (wake.py, FlowCalls.deliver_sent)."""
    try:
        if isinstance(client, RedisCluster):
            kwargs = client.get_default_node().redis_connection.connection_pool.connection_kwargs
        else:
            kwargs = client.connection_pool.connection_kwargs
        conn_timeout = kwargs.get("socket_timeout", kwargs.get("orig_socket_timeout"))
    except AttributeError:
        return None
    if conn_timeout is None and not isinstance(client, RedisCluster):
        conn = routing.connection_from(client.connection_pool)
        try:
            conn_timeout = conn.socket_timeout
        finally:
            client.connection_pool.release(conn)
    return conn_timeout
