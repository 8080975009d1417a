"""``manage.py orders_demo`` (what ``scripts/demo.sh`` runs) end to end, as a
real process against the test Redis: web server, runworker and runpump are
its own subprocesses, and every order ends in its predicted state."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from testproject.orders.demo_data import SAMPLE_CSV, generate, read_csv
from testproject.orders.rules import predict

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e
LINE = re.compile(
    r"^  (fulfilled|failed|with ignored failures|retries taken) +(\d+)  "
    r"\(predicted (\d+)\)$",
    re.MULTILINE,
)
BOUND_S = 300  # a hung demo fails the test instead of hanging the suite


def demo_env(redis_server: str, tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "ECHOMQ_URL": redis_server,
        "PYTHONUNBUFFERED": "1",
        "ECHOMQ_DB_PATH": str(tmp_path / "demo.sqlite3"),
    }
    env.pop("ECHOMQ_PREFIX", None)
    return env


def run_demo(redis_server: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "orders_demo", "--log-dir", str(tmp_path / "logs"), *args],
        cwd=ROOT,
        env=demo_env(redis_server, tmp_path),
        capture_output=True,
        text=True,
        check=False,
        timeout=BOUND_S,
    )


def expected(bodies) -> dict[str, tuple[int, int]]:
    """The summary lines ``rules.predict`` implies: ``{name: (n, n)}``."""
    outcomes = [predict(b) for b in bodies]
    fulfilled = [o for o in outcomes if o["status"] == "fulfilled"]
    counts = {
        "fulfilled": len(fulfilled),
        "failed": len(outcomes) - len(fulfilled),
        "with ignored failures": sum(o["ignored"] > 0 for o in fulfilled),
        "retries taken": sum(o["retries"] for o in outcomes),
    }
    return {name: (n, n) for name, n in counts.items()}


def summary(stdout: str) -> dict[str, tuple[int, int]]:
    return {name: (int(got), int(want)) for name, got, want in LINE.findall(stdout)}


def test_twelve_generated_orders_end_as_predicted(r, redis_server, tmp_path):
    proc = run_demo(redis_server, tmp_path, "--orders", "12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc.stdout) == expected(generate(12, seed=7))
    assert summary(proc.stdout) == {
        "fulfilled": (10, 10),
        "failed": (2, 2),
        "with ignored failures": (1, 1),
        "retries taken": (8, 8),
    }
    assert "== all 12 orders ended in their predicted state" in proc.stdout
    assert re.search(r"key prefix emq-demo-[0-9a-f]{8}\n", proc.stdout)


def test_the_sample_csv_ends_as_predicted(r, redis_server, tmp_path):
    proc = run_demo(redis_server, tmp_path, "--from-csv", str(SAMPLE_CSV))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc.stdout) == expected([b for _, b in read_csv(SAMPLE_CSV)])
    assert "== all 20 orders ended in their predicted state" in proc.stdout


def test_a_refused_row_is_listed_and_exits_1(r, redis_server, tmp_path):
    csv = tmp_path / "orders.csv"
    csv.write_text(
        "customer,email,card,lines\n"
        "Ada,ada@example.com,4242424242424242,BOOK-1*2\n"
        "Bob,bob,4242424242424242,MUG-2*0\n"
    )
    proc = run_demo(redis_server, tmp_path, "--from-csv", str(csv))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert summary(proc.stdout) == {
        "fulfilled": (1, 1),
        "failed": (0, 0),
        "with ignored failures": (0, 0),
        "retries taken": (0, 0),
    }
    assert proc.stdout.endswith(
        "== 1 problem(s):\n"
        "  - row 3 refused (400): email: must be a valid email address; "
        "lines[0].qty: must be an integer from 1 to 99\n"
    )


def test_a_missing_csv_column_is_a_one_line_error(tmp_path, redis_server):
    csv = tmp_path / "orders.csv"
    csv.write_text("customer,email\nAda,ada@example.com\n")
    proc = run_demo(redis_server, tmp_path, "--from-csv", str(csv))
    assert proc.returncode == 1
    assert proc.stderr == (
        f"CommandError: {csv}: missing column(s) card, lines; the header "
        "must name customer, email, card, lines, via (via is optional)\n"
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_keep_holds_the_processes_until_ctrl_c_then_stops_them_all(r, redis_server, tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "orders_demo",
            "--orders",
            "3",
            "--keep",
            "--log-dir",
            str(tmp_path / "logs"),
        ],
        cwd=ROOT,
        env=demo_env(redis_server, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    watchdog = threading.Timer(BOUND_S, proc.kill)
    watchdog.start()
    pids: dict[str, int] = {}
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("== --keep:"):
                break
        out = "".join(lines)
        pids = {
            name: int(pid)
            for name, pid in re.findall(r"(\w+) (\d+)", re.search(r"pids: (.*)", out).group(1))
        }
        assert sorted(pids) == ["pump", "web", "worker"]  # ECHOMQ_URL set: no private Redis
        assert all(alive(pid) for pid in pids.values())
        proc.send_signal(signal.SIGINT)
        rest = proc.stdout.read()
        assert proc.wait() == 0, out + rest
    finally:
        watchdog.cancel()
        left = [pid for pid in pids.values() if alive(pid)]
        for pid in left:  # a demo killed by the watchdog leaves its sessions running
            os.kill(pid, signal.SIGKILL)
    assert "== all 3 orders ended in their predicted state" in out
    assert rest == "\n== stopping the processes\n"
    assert left == []
