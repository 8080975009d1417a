"""A private ``redis-server`` on a free loopback port, for the test suite, the
demo and the benchmark (never a developer's Redis: 6379 is never handed out,
and a server is used only once it answers PING as the very process we
started, so a port race can never point us at someone else's server).

``start_server()`` returns a ``RedisProcess`` (``.url``, ``.port``, ``.proc``,
``.stop()``); ``free_port()`` a loopback port free right now. Every server
started is killed at interpreter exit if its owner did not stop it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

HOST = "127.0.0.1"
# Never hand out the conventional ports, even when they happen to be free.
RESERVED_PORTS = frozenset({6379, 16379})
# A cluster node also listens on port + 10000 (its bus port).
BUS_OFFSET = 10000
START_TIMEOUT_S = 10.0
CLUSTER_TIMEOUT_S = 30.0

MISSING_SERVER = "redis-server is not on PATH (apt-get install -y redis-server)"
# The server binary to start instead of redis-server (a path, or a name on PATH):
# another Redis-compatible server, such as valkey-server, or another Redis build
SERVER_VARIABLE = "ECHOMQ_REDIS_SERVER"

# Every server we start, so an interrupted session still stops them at exit.
_live: set[subprocess.Popen] = set()
# The process that started them: a forked child (a handler process, a test's
# fork) inherits ``_live`` and this module's exit hook, and must never kill
# its parent's servers when it exits.
_OWNER = os.getpid()


class ServerError(RuntimeError):
    """A private redis-server could not be started; the message says why."""


def require_binary(name: str, hint: str = "") -> str:
    """Path of ``name`` on PATH; raises ``ServerError`` (with ``hint``, what the
    caller's user should do) when it is absent."""
    path = shutil.which(name)
    if path is None:
        message = MISSING_SERVER.replace("redis-server is", f"{name} is", 1)
        raise ServerError(f"{message}. {hint}".strip() if hint else message)
    return path


def server_binary(hint: str = "") -> str:
    """Path of the server binary ``start_server`` runs: ``$ECHOMQ_REDIS_SERVER``
    (a path, or a name on PATH; docs/reference/settings.md#environment) when
    set, else ``redis-server`` on PATH. Raises ``ServerError`` when it is
    absent or not executable."""
    chosen = os.environ.get(SERVER_VARIABLE, "").strip()
    if not chosen:
        return require_binary("redis-server", hint)
    path = shutil.which(chosen)
    if path is None:
        raise ServerError(
            f"{SERVER_VARIABLE}={chosen!r} is not an executable file nor a command on PATH: "
            "it names the Redis-compatible server binary to start (unset it for redis-server)"
        )
    return path


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port(*, with_bus: bool = False) -> int:
    """A loopback port that is free now (and whose bus port is, if with_bus).

    The OS picks the port; we only keep ones low enough for a bus port below
    65536. There is a window between this check and the server binding it;
    ``start`` retries on a fresh port if the server loses that race.
    """
    for _ in range(200):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port in RESERVED_PORTS or port + BUS_OFFSET > 65535:
            continue
        if with_bus and (port + BUS_OFFSET in RESERVED_PORTS or not _port_free(port + BUS_OFFSET)):
            continue
        return port
    raise ServerError("could not find a free loopback port")


@dataclass
class RedisProcess:
    """One redis-server subprocess; ``stop()`` kills it and removes its dir."""

    port: int
    dir: Path
    proc: subprocess.Popen
    own_dir: bool = True

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    @property
    def log(self) -> Path:
        return self.dir / f"redis-{self.port}.log"

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, **kwargs)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        _live.discard(self.proc)
        if self.own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_for_ping(server: RedisProcess, timeout: float) -> bool:
    """True once the server answers PING; False if it exited or timed out."""
    deadline = time.monotonic() + timeout
    client = server.client(socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                return False
            try:
                # Our process, not someone else's server that won the port race:
                # the per-test FLUSHALL must only ever reach a server we own.
                if client.ping() and client.info("server")["process_id"] == server.proc.pid:
                    return True
            except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
                pass
            time.sleep(0.05)
        return False
    finally:
        client.close()


def start_server(
    *,
    cluster: bool = False,
    workdir: Path | None = None,
    attempts: int = 5,
    hint: str = "",
    options: dict[str, str] | None = None,
) -> RedisProcess:
    """Start one redis-server (or ``$ECHOMQ_REDIS_SERVER``: ``server_binary``)
    on a free loopback port and wait for PING.

    With ``cluster`` the node is cluster-enabled (config file in its dir) and
    its bus port is checked free too. ``workdir`` is a directory shared by the
    caller (kept on stop); otherwise a private temp dir is made and removed.
    Retries on a new port when the server dies at start (a lost port race).
    The server runs in a session of its own, so a Ctrl-C in the terminal
    reaches its owner, which stops it in order. ``hint`` joins the error
    when redis-server is missing. ``options`` override or add redis-server
    options (``{"cluster-node-timeout": "1000", "appendonly": "yes"}``).
    Raises ``ServerError``.
    """
    binary = server_binary(hint)
    options_override = dict(options or {})
    last_log = ""
    for _ in range(attempts):
        port = free_port(with_bus=cluster)
        own_dir = workdir is None
        d = Path(tempfile.mkdtemp(prefix=f"emq-redis-{port}-")) if own_dir else workdir
        config = {
            "port": str(port),
            "bind": HOST,
            "save": "",
            "appendonly": "no",
            "daemonize": "no",
            "dir": str(d),
            "logfile": str(d / f"redis-{port}.log"),
            # a shared workdir (a Cluster rig's) holds each node's files apart
            "dbfilename": f"dump-{port}.rdb",
            "appendfilename": f"appendonly-{port}.aof",
        }
        if cluster:
            config |= {
                "cluster-enabled": "yes",
                "cluster-config-file": str(d / f"nodes-{port}.conf"),
                "cluster-node-timeout": "5000",
            }
        config |= options_override
        args = [binary, *(arg for k, v in config.items() for arg in (f"--{k}", v))]
        # Config errors are printed before the log file opens, so keep stderr.
        with open(d / f"stderr-{port}.txt", "wb") as err:
            proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )
        _live.add(proc)
        server = RedisProcess(port=port, dir=d, proc=proc, own_dir=own_dir)
        if _wait_for_ping(server, START_TIMEOUT_S):
            return server
        last_log = _tail(server.log) + "\n" + _tail(d / f"stderr-{port}.txt")
        server.stop()
    raise ServerError(
        f"redis-server did not start after {attempts} attempts; last log:\n{last_log}"
    )


def restart(server: RedisProcess, timeout: float = START_TIMEOUT_S) -> RedisProcess:
    """Start ``server`` again after it stopped or was killed: same binary,
    options, port and directory (so an AOF or a cluster config file it wrote
    is read back). Returns a new ``RedisProcess``; raises ``ServerError`` when
    it does not answer PING within ``timeout`` seconds (the port taken
    meanwhile, or a corrupt file)."""
    if server.proc.poll() is None:
        raise ServerError(f"redis-server on port {server.port} is still running")
    _live.discard(server.proc)
    with open(server.dir / f"stderr-{server.port}.txt", "ab") as err:
        proc = subprocess.Popen(
            server.proc.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    _live.add(proc)
    again = RedisProcess(port=server.port, dir=server.dir, proc=proc, own_dir=server.own_dir)
    if not _wait_for_ping(again, timeout):
        log = _tail(again.log)
        again.stop()
        raise ServerError(f"redis-server on port {server.port} did not restart; last log:\n{log}")
    return again


@atexit.register
def _kill_leftovers() -> None:
    # Owners normally stop their servers; this covers a hard interrupt.
    if os.getpid() != _OWNER:
        return
    for proc in list(_live):
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
    _live.clear()
