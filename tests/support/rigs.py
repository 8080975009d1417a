"""Real Redis servers for the test suite, a single server and a Cluster.

Each rig is a ``redis-server`` subprocess on a free loopback port with its own
temporary directory, no persistence, and a log file we show when it fails to
start. Nothing here ever connects to a port we did not start a server on, so a
developer's Redis (127.0.0.1:6379 included) is never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from echomq_django.testing.redis_server import (
    HOST,
    RedisProcess,
    ServerError,
    free_port,
    require_binary,
)
from echomq_django.testing.redis_server import restart as _restart
from echomq_django.testing.redis_server import start_server as _start_server

CLUSTER_TIMEOUT_S = 30.0
# The replica rig: a master unreachable for 1 s is failed; any replica may be
# elected however long ago it last heard from its master (validity factor 0).
HA_OPTIONS = {"cluster-node-timeout": "1000", "cluster-replica-validity-factor": "0"}
TEST_HINT = (
    "The test suite starts its own Redis servers; run the README test command, "
    "`bash scripts/test.sh`, which installs redis-server and then runs pytest."
)
__all__ = [
    "HOST",
    "Cluster",
    "RedisProcess",
    "RigError",
    "free_port",
    "start_cluster",
    "start_server",
]


class RigError(ServerError):
    """A Redis rig could not be started."""


def start_server(**kwargs) -> RedisProcess:
    """``devserver.start_server`` with the test command's hint; ``RigError``."""
    try:
        return _start_server(hint=TEST_HINT, **kwargs)
    except RigError:
        raise
    except ServerError as err:
        raise RigError(str(err)) from None


@dataclass
class Cluster:
    """Cluster-enabled nodes on loopback, all slots assigned: three masters,
    and with ``start_cluster(replicas=1)`` one replica each (a failover rig:
    ``kill_master``, ``wait_promoted``, ``restart``)."""

    nodes: list[RedisProcess]
    dir: Path
    ports: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.ports = [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.ports[0]}/0"

    def live(self) -> list[RedisProcess]:
        return [n for n in self.nodes if n.proc.poll() is None]

    def master_port(self, key: str) -> int:
        """The port of the master serving ``key``'s slot, as a live node sees it."""
        return self.shard_ports(key)[0]

    def shard_ports(self, key: str) -> list[int]:
        """The ports serving ``key``'s slot: its master first, then its
        replicas (from CLUSTER NODES: CLUSTER SLOTS may not list a replica
        yet)."""
        for node in self.live():
            c = node.client(socket_timeout=1)
            try:
                slot = int(c.execute_command("CLUSTER KEYSLOT", key))
                raw = c.execute_command("CLUSTER", "NODES")
            except redis.RedisError:
                continue
            finally:
                c.close()
            text = reply_text(raw)
            rows = [line.split() for line in text.splitlines() if line.strip()]
            port = {r[0]: int(r[1].split("@")[0].rsplit(":", 1)[1]) for r in rows}
            for r in rows:
                for part in r[8:]:
                    low, _, high = part.partition("-")
                    if low.isdigit() and int(low) <= slot <= int(high or low):
                        replicas = [port[x[0]] for x in rows if x[3] == r[0]]
                        return [port[r[0]], *replicas]
        raise RigError(f"no live node knows the shard of {key!r}")

    def kill_shard(self, key: str) -> list[RedisProcess]:
        """SIGKILL the master serving ``key`` and its replicas: no failover can
        happen, so every node answers CLUSTERDOWN until ``restart``."""
        ports = self.shard_ports(key)
        dead = [n for n in self.nodes if n.port in ports]
        for node in dead:
            node.proc.kill()
            node.proc.wait(timeout=5)
        return dead

    def kill_master(self, key: str) -> RedisProcess:
        """SIGKILL the master serving ``key``; returns its (dead) process."""
        port = self.master_port(key)
        node = next(n for n in self.nodes if n.port == port)
        node.proc.kill()
        node.proc.wait(timeout=5)
        return node

    def wait_promoted(self, key: str, dead: RedisProcess, timeout: float = CLUSTER_TIMEOUT_S):
        """Wait until a replica serves ``key`` in place of ``dead`` and every
        live node reports ``cluster_state:ok``; returns the new master's port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.master_port(key)
            except RigError:
                port = dead.port
            if port != dead.port and _cluster_ok(self.live()):
                return port
            time.sleep(0.05)
        raise RigError(f"no replica took over {key!r} from port {dead.port} in {timeout}s")

    def restart(self, dead: RedisProcess) -> RedisProcess:
        """Start a killed node again (it rejoins as a replica of whoever took
        its slots) and wait for every node to report ``cluster_state:ok``."""
        again = _restart(dead)
        self.nodes[self.nodes.index(dead)] = again
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not (_cluster_ok(self.live()) and _replicas_synced(self.live())):
            if time.monotonic() > deadline:
                raise RigError(f"cluster not ok after restarting port {dead.port}")
            time.sleep(0.05)
        return again

    def move_slot(self, key: str, to_port: int, batch: int = 5, pause_s: float = 0.005) -> int:
        """Reshard ``key``'s slot to the master on ``to_port`` as ``redis-cli
        --cluster reshard`` does, while clients go on using it: ``IMPORTING``
        on the target, ``MIGRATING`` on the source, ``MIGRATE`` of ``batch``
        keys at a time with ``pause_s`` s between batches (no ``REPLACE``: a
        key written on both sides fails it), then ``SETSLOT NODE`` on the
        target, the source and every other master. Returns the keys moved."""
        source_port = self.master_port(key)
        by_port = {n.port: n.client(socket_timeout=10) for n in self.live()}
        try:
            source, target = by_port[source_port], by_port[to_port]
            slot = int(source.execute_command("CLUSTER KEYSLOT", key))
            source_id = reply_text(source.execute_command("CLUSTER MYID"))
            target_id = reply_text(target.execute_command("CLUSTER MYID"))
            target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
            source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", target_id)
            moved = 0
            while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, batch):
                source.execute_command("MIGRATE", HOST, to_port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause_s)
            masters = [target, source] + [
                c for port, c in by_port.items() if port not in (source_port, to_port)
            ]
            for c in masters:
                if reply_text(c.execute_command("ROLE")[0]) == "master":
                    c.execute_command("CLUSTER SETSLOT", slot, "NODE", target_id)
            return moved
        finally:
            for c in by_port.values():
                c.close()

    def kill_all(self) -> None:
        """SIGKILL every node: no node answers until ``restart_all``."""
        for node in self.live():
            node.proc.kill()
            node.proc.wait(timeout=5)

    def restart_all(self) -> None:
        """Start every killed node again (same port, directory, cluster
        config file and, with appendonly, data) and wait until each reports
        ``cluster_state:ok``."""
        self.nodes = [n if n.proc.poll() is None else _restart(n) for n in self.nodes]
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not _cluster_ok(self.nodes):
            if time.monotonic() > deadline:
                raise RigError("cluster not ok after restarting every node")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def reply_text(value) -> str:
    """A reply as ``str``: bytes decoded, anything else through ``str``."""
    return value.decode() if isinstance(value, bytes) else str(value)


def log_tail(node: RedisProcess, lines: int = 10) -> str:
    """The last ``lines`` lines of ``node``'s log, headed by its port."""
    try:
        text = node.log.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        text = ["(no log)"]
    return "\n".join([f"-- redis-server on port {node.port}, log tail:", *text])


def cluster_state(client: redis.Redis) -> str:
    """The node's ``cluster_state`` field from CLUSTER INFO ("ok", "fail")."""
    info = client.execute_command("CLUSTER INFO")
    # redis-py parses the reply into a dict; older versions return the text.
    if isinstance(info, dict):
        state = info.get("cluster_state", info.get(b"cluster_state", ""))
        return reply_text(state)
    text = reply_text(info)
    for line in text.splitlines():
        if line.startswith("cluster_state:"):
            return line.split(":", 1)[1].strip()
    return ""


def _cluster_ok(nodes: list[RedisProcess]) -> bool:
    for node in nodes:
        c = node.client(socket_timeout=1)
        try:
            if cluster_state(c) != "ok":
                return False
        except redis.RedisError:
            return False
        finally:
            c.close()
    return True


def _replicas_synced(nodes: list[RedisProcess]) -> bool:
    for node in nodes:
        c = node.client(socket_timeout=1)
        try:
            info = c.info("replication")
            if info["role"] == "slave" and info.get("master_link_status") != "up":
                return False
        except redis.RedisError:
            return False
        finally:
            c.close()
    return True


def start_cluster(masters: int = 3, replicas: int = 0, options: dict | None = None) -> Cluster:
    """Start ``masters`` nodes (and ``replicas`` per master, with a 1 s node
    timeout so a killed master fails over in a few seconds), join them with
    ``redis-cli --cluster create``. ``options`` add redis-server options to
    every node (``{"appendonly": "yes"}``: a node restarted with
    ``restart_all`` keeps its data).

    Returns once every node reports ``cluster_state:ok`` (and every replica
    is in sync). On any failure all nodes started so far are stopped before
    the error propagates.
    """
    try:
        cli = require_binary("redis-cli", TEST_HINT)
    except ServerError as err:
        raise RigError(str(err)) from None
    d = Path(tempfile.mkdtemp(prefix="emq-redis-cluster-"))
    nodes: list[RedisProcess] = []
    try:
        options = {**(HA_OPTIONS if replicas else {}), **(options or {})}
        for _ in range(masters * (1 + replicas)):
            nodes.append(start_server(cluster=True, workdir=d, options=options))
        addresses = [f"{HOST}:{n.port}" for n in nodes]
        create = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *addresses,
                "--cluster-replicas",
                str(replicas),
                "--cluster-yes",
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,  # the return code is checked below, with the output
        )
        if create.returncode != 0:
            raise RigError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
        deadline = time.monotonic() + CLUSTER_TIMEOUT_S
        while not _cluster_ok(nodes):
            if time.monotonic() > deadline:
                raise RigError("cluster did not reach cluster_state:ok in time")
            time.sleep(0.1)
        while replicas and not _replicas_synced(nodes):
            if time.monotonic() > deadline:
                raise RigError("cluster replicas did not sync in time")
            time.sleep(0.1)
        return Cluster(nodes=nodes, dir=d)
    except BaseException:
        for node in nodes:
            node.stop()
        shutil.rmtree(d, ignore_errors=True)
        raise
