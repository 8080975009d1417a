"""The benchmark as a smoke test: ``python -m bench --quick``
against the test Redis, so it never rots. No timing is asserted: only that
it runs, writes the JSON it documents, and that every root received all of
its children's values (the peer's rows too, when BullMQ's client is
installed); and ``python -m bench.prune_instructions`` once, when valgrind
is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e

RUN_KEYS = {
    "system",
    "topology",
    "label",
    "nodes",
    "layout",
    "add_ms",
    "add_nodes_per_s",
    "resolve_s",
    "resolve_nodes_per_s",
    "mem_bytes_per_node",
    "round_trips_per_node",
    "redis_commands_per_node",
    "worker_cpu_us_per_node",
    "redis_cpu_us_per_node",
    "values_ok",
    "values_checked",
    "problems",
    "processes",
}


def test_quick_benchmark_runs_and_every_root_receives_every_value(redis_server, tmp_path):
    out = tmp_path / "bench.json"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--quick",
            "--redis-url",
            redis_server,
            "--json",
            str(out),
            "--no-progress",
            "--timeout",
            "60",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ratio" in proc.stdout or "not installed" in proc.stdout or "bullmq" not in proc.stdout
    data = json.loads(out.read_text())
    assert {"meta", "runs", "ratios", "targets"} <= set(data)
    assert {"date", "cpus", "redis", "python", "ours_workers"} <= set(data["meta"])
    ours = [r for r in data["runs"] if r["system"] == "echomq"]
    assert [r["topology"] for r in ours] == ["wide-100", "tree-1x5x100", "cross-100"]
    assert [r["nodes"] for r in ours] == [101, 106, 101]
    for run in data["runs"]:
        assert set(run) >= RUN_KEYS, RUN_KEYS - set(run)
        assert run["values_ok"], (run["system"], run["topology"], run["problems"])
        assert run["problems"] == []
        assert run["resolve_s"] is not None and run["mem_bytes_per_node"] > 0
        # every child's value reached its parent: 100 leaves (+ 5 branches)
        assert run["values_checked"] == run["nodes"] - 1
    # the latency scenario: every measurement, each system
    kinds = {"enqueue", "flow_same", "flow_cross", "delayed", "retry"}
    for row in data["latency"]:
        assert row["samples"] == 5
        for kind in kinds:
            assert row[kind]["p50"] <= row[kind]["p90"] <= row[kind]["p99"] <= row[kind]["max"]
        if row["system"] == "echomq (Cluster)":  # not counted on a Cluster
            assert row["idle_cmds_per_s"] is None
        else:
            assert row["idle_cmds_per_s"] >= 0
    assert data["latency"][0]["system"] == "echomq"
    assert data["latency"][-1]["system"] == "echomq (Cluster)"  # the Cluster leg ran
    for row in data["plain"]:
        assert row["jobs"] == 500 and row["drain_s"] > 0 and row["bulk_add_s"] > 0
        assert {"add", "resolve", "total"} <= set(run["round_trips_per_node"])
    if data["meta"]["bullmq"]:
        assert len(data["ratios"]) == 3
        assert {r["system"] for r in data["runs"]} == {"echomq", "bullmq"}


def test_the_wait_scenario_runs_and_every_waiter_wakes(redis_server, tmp_path):
    """``python -m bench --scenarios wait --quick``: 5 round trips and 50
    waiters, ours (and BullMQ's in Node when ``bench/node`` is installed);
    every waiter woke (a delay per job), the percentiles in order."""
    out = tmp_path / "wait.json"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    args = ["--scenarios", "wait", "--quick", "--redis-url", redis_server, "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args, "--no-progress"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["wait"]
    assert rows[0]["system"] == "echomq"
    for row in rows:
        trip, wake = row["round_trip_ms"], row["wake_delay_ms"]
        assert (trip["n"], wake["n"], row["waiters"]) == (5, 50, 50)
        assert 0 < trip["p50"] <= trip["p90"] <= trip["p99"] <= trip["max"]
        assert wake["p50"] <= wake["p90"] <= wake["p99"] <= wake["max"]
        assert row["idle_cmds_per_s"] >= 0
    assert "target p99 <= 20 ms" in proc.stdout


@pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("callgrind_control")), reason="no valgrind"
)
def test_prune_instructions_counts_one_prune():
    """``python -m bench.prune_instructions`` (its own redis-server under
    callgrind): 1,100 completed children, the default 1,000 kept, so one
    prune removes 100, and a row costs some thousands of instructions."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.prune_instructions", "--children", "1100"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert out.startswith("prune removed 100 rows in ")
    per_row = int(out.rsplit(": ", 1)[1].split()[0].replace(",", ""))
    assert 5_000 < per_row < 200_000


@pytest.mark.skipif(
    not (shutil.which("valgrind") and shutil.which("callgrind_control")), reason="no valgrind"
)
def test_script_instructions_counts_a_wide_flows_claims_and_completions():
    """``python -m bench.script_instructions`` (its own redis-server under callgrind): a 1+200
    flow's claims and completions, each some tens of thousands of instructions a node (they
    raise when a leaf is left unclaimed or the root unreleased); a bad flag exits 2."""
    cmd = [sys.executable, "-m", "bench.script_instructions", "--nodes", "200", "--batch", "50"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    claim, complete = (int(part.split()[1].replace(",", "")) for part in out.stdout.split(";"))
    assert 20_000 < claim < 400_000 and 20_000 < complete < 400_000, out.stdout
    bad = subprocess.run([*cmd, "--nodes", "0"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "--nodes must be at least 1 (got 0)" in bad.stderr


def test_a_small_soak_runs_and_its_mirror_holds_what_redis_holds():
    """``python -m bench --soak`` at a tenth of a round, two samples: the
    deaths its mix predicts (plain jobs 7 and 1007; flow child 7 and the
    parent it fails), a mirror holding exactly the rows Redis holds, the
    breakdown by kind and the ratio line. Bad flags exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    args = ["--soak-jobs", "2000", "--soak-flows", "200", "--soak-every", "1000"]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--soak", *args, "--workers", "1x4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    head = lines.index(next(line for line in lines if line.split()[:2] == ["jobs", "flows"]))
    samples = [line.replace(",", "").split() for line in lines[head + 1 : head + 3]]
    assert [int(s[0]) for s in samples] == [1000, 2000]
    for _jobs, _flows, _mem, _keys, mirror, completed, dead, _s in samples:
        assert int(mirror) == int(completed) + int(dead)
    assert [int(s[6]) for s in samples] == [3, 4]
    assert any(line.strip().startswith("overhead.hashtable.main") for line in lines)
    assert lines[-1].startswith("used_memory after 2,000 jobs is ")
    bad = subprocess.run(
        [sys.executable, "-m", "bench", "--soak", "--second-share", "101"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "--second-share is 0-100" in bad.stderr


def test_the_restart_latency_scenario_runs(redis_server, tmp_path):
    """``python -m bench.restart --restarts 1``: it runs, writes its figures,
    and the delayed job ran on the new worker (no timing asserted)."""
    out = tmp_path / "restart.json"
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.restart", "--restarts", "1", "--redis-url", redis_server,
         "--json", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())
    assert (data["restarts"], data["counted"] + data["late_start"], data["bullmq"]) == (1, 1, "n/a")
    assert "target p90 <= 100 ms" in proc.stdout
