"""A Redis Sentinel rig on loopback for the fault suite: one master, one
replica and three sentinels (``redis-server --sentinel``), each on a free
port with its own directory, and a manual failover (``SENTINEL FAILOVER``)
that returns once the replica is the master every sentinel names and the
old master follows it. Nothing here connects to a port it did not start a
server on."""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from echomq_django.testing.redis_server import ServerError, server_binary
from tests.support.rigs import HOST, RedisProcess, RigError, free_port, start_server

MASTER_NAME = "emq-test"
START_TIMEOUT_S = 10.0
FAILOVER_TIMEOUT_S = 30.0
# a master unanswered for 1 s is down to a sentinel; two sentinels agree
# a master takes writes only while a replica is in sync: an old master
# refuses them once its replica is promoted (docs/howto/sentinel.md)
SAFE_WRITES = {"min-replicas-to-write": "1", "min-replicas-max-lag": "2"}
SENTINEL_OPTIONS = {"down-after-milliseconds": "1000", "failover-timeout": "5000"}


def _sentinel(master_port: int) -> RedisProcess:
    """One sentinel watching the master on ``master_port``; ``RigError``."""
    port = free_port()
    d = Path(tempfile.mkdtemp(prefix=f"emq-sentinel-{port}-"))
    lines = [
        f"port {port}",
        f"bind {HOST}",
        "daemonize no",
        f"dir {d}",
        f"logfile {d / f'redis-{port}.log'}",
        f"sentinel monitor {MASTER_NAME} {HOST} {master_port} 2",
        *(f"sentinel {k} {MASTER_NAME} {v}" for k, v in SENTINEL_OPTIONS.items()),
    ]
    conf = d / "sentinel.conf"
    conf.write_text("\n".join(lines) + "\n")
    try:
        binary = server_binary()
    except ServerError as err:
        raise RigError(str(err)) from None
    proc = subprocess.Popen(
        [binary, str(conf), "--sentinel"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = RedisProcess(port=port, dir=d, proc=proc)
    client = server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if client.info("server")["process_id"] == proc.pid:
                    return server
            except redis.RedisError:
                pass
            time.sleep(0.05)
    finally:
        client.close()
    server.stop()
    raise RigError(f"sentinel on port {port} did not start")


@dataclass
class SentinelRig:
    """The rig: ``master`` and ``replica`` (the servers as started: after a
    failover the replica is the master), three ``sentinel_servers``."""

    master: RedisProcess
    replica: RedisProcess
    sentinel_servers: list[RedisProcess] = field(default_factory=list)

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        """``[(host, port), ...]``: what ``ECHOMQ["SENTINELS"]`` takes."""
        return [(HOST, s.port) for s in self.sentinel_servers]

    @property
    def url(self) -> str:
        """The same as a ``redis+sentinel://`` URL."""
        hosts = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"

    def master_port(self) -> int:
        """The master's port, as the first sentinel that answers names it."""
        for s in self.sentinel_servers:
            try:
                with s.client(socket_timeout=1) as c:
                    return int(c.sentinel_get_master_addr_by_name(MASTER_NAME)[1])
            except redis.RedisError:
                continue
        raise RigError("no sentinel answers")

    def _settled(self, port: int) -> bool:
        """Every sentinel names ``port`` the master, it says it is one and
        counts a good replica (``SAFE_WRITES``: until then it refuses writes
        with NOREPLICAS), and the other server replicates from it."""
        try:
            names = set()
            for s in self.sentinel_servers:
                with s.client(socket_timeout=1) as c:
                    names.add(int(c.sentinel_get_master_addr_by_name(MASTER_NAME)[1]))
            other = self.replica if port == self.master.port else self.master
            with redis.Redis(host=HOST, port=port, socket_timeout=1) as m:
                mine = m.info("replication")
            role = mine["role"] if mine.get("min_slaves_good_slaves", 0) >= 1 else "no good replica"
            with other.client(socket_timeout=1) as o:
                info = o.info("replication")
            return (
                names,
                role,
                info["role"],
                info.get("master_port"),
                info.get("master_link_status"),
            ) == (
                {port},
                "master",
                "slave",
                port,
                "up",
            )
        except redis.RedisError:
            return False

    def wait_ready(self, timeout: float = FAILOVER_TIMEOUT_S) -> None:
        """Until the sentinels know the replica (a failover needs one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self.sentinel_servers[0].client(socket_timeout=1) as c:
                    replicas = c.sentinel_slaves(MASTER_NAME)
                    sentinels = c.sentinel_sentinels(MASTER_NAME)
                if replicas and len(sentinels) == 2 and self._settled(self.master.port):
                    return
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise RigError("the sentinels did not learn the replica and each other in time")

    def failover(self, timeout: float = FAILOVER_TIMEOUT_S) -> int:
        """``SENTINEL FAILOVER``; returns the new master's port once settled."""
        before = self.master_port()
        with self.sentinel_servers[0].client(socket_timeout=2) as c:
            c.execute_command("SENTINEL", "FAILOVER", MASTER_NAME)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.master_port()
            if port != before and self._settled(port):
                return port
            time.sleep(0.1)
        raise RigError(f"no failover within {timeout} s")

    def stop(self) -> None:
        for s in [*self.sentinel_servers, self.replica, self.master]:
            s.stop()


def start_sentinel_rig() -> SentinelRig:
    """Start the rig and wait until the sentinels know the replica and each
    other; raises ``RigError``."""
    master = start_server(options=SAFE_WRITES)
    replica = start_server(options=SAFE_WRITES | {"replicaof": f"{HOST} {master.port}"})
    rig = SentinelRig(master, replica)
    try:
        rig.sentinel_servers = [_sentinel(master.port) for _ in range(3)]
        rig.wait_ready()
    except BaseException:
        rig.stop()
        raise
    return rig
