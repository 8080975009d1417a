"""A private ``redis-server`` for one benchmark run.

It listens on a free loopback port (never 6379), keeps nothing on disk and is
stopped when the run ends, so the benchmark never touches a Redis you run.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

HOST = "127.0.0.1"
RESERVED_PORTS = frozenset({6379, 16379})


class ServerError(RuntimeError):
    """The private redis-server could not be started."""


def _free_port() -> int:
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            port = s.getsockname()[1]
        if port not in RESERVED_PORTS:
            return port
    raise ServerError("no free loopback port")


class PrivateRedis:
    """``with PrivateRedis() as url:`` a redis-server on a free loopback port."""

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or shutil.which("redis-server")
        if not self.binary:
            raise ServerError(
                "redis-server is not on PATH (apt-get install redis-server), "
                "or pass --redis-url to use a server you started"
            )
        self.proc: subprocess.Popen | None = None
        self.dir: Path | None = None
        self.url = ""

    def start(self) -> str:
        for _ in range(5):
            port = _free_port()
            self.dir = Path(tempfile.mkdtemp(prefix=f"emq-bench-redis-{port}-"))
            args = [
                self.binary,
                "--port",
                str(port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "redis.log"),
            ]
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            client = redis.Redis(
                host=HOST, port=port, socket_timeout=0.5, socket_connect_timeout=0.5
            )
            deadline = time.monotonic() + 10
            try:
                while time.monotonic() < deadline and self.proc.poll() is None:
                    try:
                        # ours, not a server that won the port race
                        if client.info("server")["process_id"] == self.proc.pid:
                            self.url = f"redis://{HOST}:{port}/0"
                            return self.url
                    except redis.RedisError:
                        pass
                    time.sleep(0.05)
            finally:
                client.close()
            self.stop()
        raise ServerError("redis-server did not start on a free loopback port")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
