"""``python -m bench.prune_instructions``: the instructions Redis spends per
row that retention prunes, counted by valgrind's callgrind, so
the figure does not move with a noisy machine (repeatable to about 1%).

A redis-server runs under ``valgrind --tool=callgrind`` with its
instrumentation off; a held parent gets ``--children`` completed children
(one more child, delayed for ever, keeps it waiting), then instrumentation
is switched on around one ``prune`` with the default retention (completed:
1,000), the count is dumped and divided by the rows removed. ``--lua DIR``
runs the scripts of another checkout's ``lua/`` (an A/B against the same
server binary). Needs ``valgrind`` and ``callgrind_control`` on PATH.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from echomq_django.testing.redis_server import HOST, free_port

Q = "wide"
SETTLE_S = 0.5  # callgrind reads its control commands when the server next wakes (10 Hz cron)


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)
    time.sleep(SETTLE_S)


def dumps(folder: Path) -> list[tuple[str, int]]:
    """Each callgrind dump in ``folder``: its trigger (``callgrind_control -d NAME``'s name
    last) and its instructions (its ``summary:`` / ``totals:`` line)."""
    out = []
    for dump in folder.glob("callgrind.out*"):
        lines = dump.read_text().splitlines()
        trigger = next((ln.split()[-1] for ln in lines if ln.startswith("desc: Trigger")), "")
        totals = [int(ln.split()[1]) for ln in lines if ln.startswith(("summary:", "totals:"))]
        out.append((trigger, max(totals, default=0)))
    return out


def _total(folder: Path) -> int:
    """The instructions of the last dump."""
    return max((count for _, count in dumps(folder)), default=0)


@contextlib.contextmanager
def callgrind_server(tool: str, lua: Path | None = None):
    """A redis-server under ``valgrind --tool=callgrind``, its instrumentation off, on a free
    loopback port, for ``python -m bench.<tool>``'s counts: yields ``(process, url, folder of
    its dumps)``; ``lua``: another checkout's ``lua/`` for this process's scripts. Stops the
    server and removes the dumps after. Raises ``SystemExit`` when valgrind, callgrind_control
    or redis-server is not on PATH."""
    for name in ("valgrind", "callgrind_control", "redis-server"):
        if not shutil.which(name):
            raise SystemExit(f"python -m bench.{tool}: {name} is not on PATH")
    if lua is not None:
        import echomq_django.protocol.scripts as scripts

        scripts.lua_dir = lambda: lua
    folder = Path(tempfile.mkdtemp(prefix="emq-callgrind-"))
    port = free_port()
    server = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={folder}/callgrind.out", "redis-server", "--port", str(port),
         "--bind", HOST, "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"redis://{HOST}:{port}/0"
        client = redis.Redis.from_url(url)
        for _ in range(300):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.1)
        yield server, url, folder
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


def measure(children: int, lua: Path | None = None) -> tuple[int, int]:
    """Start the server, fill it, count one prune; returns (rows removed,
    instructions)."""
    from .soak import setup_django

    with callgrind_server("prune_instructions", lua) as (server, url, folder):
        setup_django(url, ":memory:")
        import bench.handlers  # noqa: F401  (bench.leaf / bench.root)
        from echomq_django import EchoMQ, Flow, Worker

        mq = EchoMQ(redis.Redis.from_url(url))
        kids = [Flow(Q, "bench.leaf", {"i": i}) for i in range(children)]
        kids.append(Flow(Q, "bench.leaf", {"i": -1}, delay_ms=10**11))  # holds the parent
        mq.add_flow(Flow(Q, "bench.root", {}, children=kids))
        Worker([Q], concurrency=50, mq=mq, batch=50).run(burst=True)
        mq.lifecycle.prune("warm")  # an empty queue: loads the script before counting
        _control(server.pid, "-i", "on")
        _control(server.pid, "-z")
        removed = mq.lifecycle.prune(Q).removed
        _control(server.pid, "-d")
        _control(server.pid, "-i", "off")
        return removed, _total(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.prune_instructions", description=__doc__)
    p.add_argument("--children", type=int, default=2_000, help="completed children (default 2000)")
    p.add_argument("--lua", type=Path, help="another checkout's lua/ folder")
    args = p.parse_args(argv)
    removed, instructions = measure(args.children, args.lua)
    print(f"prune removed {removed:,} rows in {instructions:,} instructions: "
          f"{instructions / max(removed, 1):,.0f} per row")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
