"""``./manage.py runpump`` as a real process: it delivers cross-queue
completions, stops on SIGTERM, and says in one line what it cannot do."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from echomq_django import EchoMQ, Flow
from tests.support.workerkit import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("subprocess_db")]


def runpump(url, *args, **kw):
    env = {**os.environ, "ECHOMQ_URL": url, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "manage.py", "runpump", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_once_delivers_and_prints_a_line_per_sweep_at_verbosity_2(r, redis_server):
    mq = EchoMQ(r, cross_queue_scripts=False)  # completions on the flow outbox, as on a Cluster
    mq.add_flow(
        Flow(
            "p",
            "parent",
            {},
            job_id="P",
            children=[Flow("c", "child", {}, job_id=f"k{i}") for i in range(3)],
        )
    )
    for job in mq.claim("c", 10):
        mq.complete(job, job.id)
    proc = runpump(redis_server, "p", "c", "--once", "--no-mirror", "--verbosity", "2")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert mq.get_job("p", "P").state == "pending"
    [line] = [ln for ln in err.splitlines() if ln.split(" ", 1)[0] == "sweep" or " sweep " in ln]
    assert "'c': {'delivered': 3, 'released': 1}" in line


def test_unreachable_redis_at_start_exits_1_with_one_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    proc = runpump(f"redis://127.0.0.1:{port}/0", "orders", "--once")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(
        f"CommandError: runpump: Redis is unreachable at redis://127.0.0.1:{port}/0"
    )


@pytest.mark.parametrize("command", ["runpump", "runworker"])
def test_an_unreachable_cluster_at_start_exits_1_with_one_line(command):
    """CLUSTER set and no startup node answering: redis-py's RedisCluster
    fails as it is built (RedisClusterException, not a ConnectionError);
    both commands say where in one line instead of a traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.support.fault_settings",
        "ECHOMQ_CLUSTER": "1",
        "ECHOMQ_URL": f"redis://127.0.0.1:{port}/0",
    }
    once = "--once" if command == "runpump" else "--burst"
    proc = subprocess.run(
        [sys.executable, "manage.py", command, "fa", once],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    [line] = proc.stderr.strip().splitlines()
    lead = "CommandError: runpump" if command == "runpump" else "runworker"
    assert line.startswith(f"{lead}: Redis Cluster is unreachable at 127.0.0.1:{port}: ")


def test_sigterm_stops_gracefully_with_exit_0(r, redis_server):
    EchoMQ(r).enqueue("orders", "x", {}, job_id="due", delay_ms=1)
    proc = runpump(redis_server, "orders", "--interval", "0.1", "--no-mirror", "--verbosity", "1")
    # once it promoted the job it is sweeping, its signal handlers installed
    # (a fixed sleep lost that race on a loaded machine: killed by SIGTERM, -15)
    wait_for(lambda: EchoMQ(r).get_job("orders", "due").state == "pending", what="a sweep")
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "SIGTERM received, stopping after this sweep" in err
    assert EchoMQ(r).get_job("orders", "due").state == "pending"  # promoted while it ran


def test_bad_queue_name_is_refused(redis_server):
    proc = runpump(redis_server, "bad queue", "--once")
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "invalid queue name 'bad queue'" in err


def test_without_migrate_the_commands_say_so_in_one_line(r, redis_server, tmp_path):
    """No traceback per sweep: one line naming the fix, and the Redis side
    still runs."""
    env = {**os.environ, "ECHOMQ_URL": redis_server, "ECHOMQ_DB_PATH": str(tmp_path / "db")}
    EchoMQ(r).enqueue("q", "t.echo", 1, job_id="j1")
    for args in (["runpump", "q", "--once"], ["runworker", "q", "--burst"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        lines = [ln for ln in done.stderr.splitlines() if "manage.py migrate" in ln]
        assert len(lines) == 1, done.stderr
        assert "echomq_django's tables are missing from database 'default'" in lines[0]
    assert EchoMQ(r).get_job("q", "j1").result == 1
