"""The demo's processes: free ports, a private redis-server, children in
sessions of their own, stopped in order; HTTP with JSON; the progress line.
Used by ``demo_run.Demo`` (``manage.py orders_demo``)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from django.conf import settings

from echomq_django.testing.redis_server import ServerError, start_server

BASE_DIR = Path(settings.BASE_DIR)
GRACE_S = 10.0  # s a process gets between SIGTERM and SIGKILL
START_TIMEOUT_S = 30.0  # s for Redis and the web server to answer


class DemoError(Exception):
    """The demo cannot go on; the message says why (one line or a log tail)."""


def http_json(method: str, url: str, body=None, timeout: float = 30.0) -> tuple[int, dict]:
    """``(status, decoded JSON body)`` of one request; an error status is
    returned, not raised. Raises ``OSError`` when nothing answers."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as err:
        text = err.read()
        try:
            return err.code, json.loads(text)
        except ValueError:
            return err.code, {"errors": {"body": text[:200].decode(errors="replace")}}


class Processes:
    """The child processes the demo started, in start order."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.started: dict[str, tuple[list[str], dict | None]] = {}  # name -> (args, env)

    def start(self, name: str, args: list[str], env: dict | None = None) -> subprocess.Popen:
        """Start ``args`` in a session of its own (a Ctrl-C in the terminal
        reaches the demo only, which then stops it in order), output in
        ``<log_dir>/<name>.log`` (appended to when it is started again)."""
        mode = "ab" if name in self.started else "wb"
        self.started[name] = (args, env)
        with open(self.log(name), mode) as log:
            proc = subprocess.Popen(
                args,
                cwd=BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def crash_and_restart(self, names: list[str]) -> None:
        """SIGKILL ``names`` (no warning, no clean-up: a crash) and start
        each again as it was started."""
        for name in names:
            proc = self.procs.pop(name)
            proc.kill()
            proc.wait()
        for name in names:
            self.start(name, *self.started[name])

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log(name).read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return "(no log)"
        return "\n".join("    " + line for line in text)

    def check(self) -> None:
        """Raise ``DemoError`` with its log tail when a process has exited."""
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise DemoError(
                    f"{name} exited with status {proc.returncode}; the end of "
                    f"{self.log(name)}:\n{self.tail(name)}"
                )

    def stop(self, names: list[str] | None = None) -> None:
        """SIGTERM ``names`` (default: all), wait up to ``GRACE_S`` s in all,
        SIGKILL whatever is left; a Ctrl-C meanwhile cuts the wait short.
        Only processes this object started."""
        chosen = [self.procs.pop(n) for n in list(names or self.procs) if n in self.procs]
        for proc in chosen:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + GRACE_S
        try:
            for proc in chosen:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            pass
        finally:
            for proc in chosen:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def start_redis(procs: Processes) -> str:
    """A private ``redis-server`` (``echomq_django.testing.redis_server``: no persistence,
    its log in the log dir) on a free loopback port, stopped with the demo's
    other processes; returns its URL. Raises ``DemoError`` when redis-server
    is missing or never answers."""
    try:
        server = start_server(
            workdir=procs.log_dir,
            hint="Run `bash scripts/demo.sh`, which installs it, or set ECHOMQ_URL "
            "to a Redis of yours.",
        )
    except ServerError as err:
        raise DemoError(str(err)) from None
    procs.procs["redis"] = server.proc
    return server.url


class Progress:
    """One updating line on a terminal (``\\r``), or a plain line every few
    seconds when the output is not one."""

    WIDTH = 30

    def __init__(self, out, total: int) -> None:
        self.out, self.total = out, total
        self.tty = hasattr(out, "isatty") and out.isatty()
        self.printed_at = 0.0
        self.drawn = 0

    def show(
        self, done: int, fulfilled: int, failed: int, elapsed: float, final: bool = False
    ) -> None:
        if not self.tty and not final and time.monotonic() - self.printed_at < 5:
            return
        self.printed_at = time.monotonic()
        filled = self.WIDTH * done // max(self.total, 1)
        line = (
            f"  flows [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{self.total}"
            f"  fulfilled {fulfilled}  failed {failed}  {elapsed:.1f}s"
        )
        if self.tty:  # pad over a longer line drawn before
            self.out.write("\r" + line.ljust(self.drawn) + ("\n" if final else ""))
            self.drawn = len(line)
        else:
            self.out.write(line + "\n")
        self.out.flush()
