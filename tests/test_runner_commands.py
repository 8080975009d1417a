"""``runworker`` and ``runpump`` called in-process (``call_command``): a flag
that breaks its rule, a Redis Cluster node without ``CLUSTER`` and a DB index
out of range each end the command with exit code 1 and one line saying so.
(The commands as real processes: tests/e2e/.)"""

from __future__ import annotations

import logging

import pytest


def run_command(name: str, *args: str) -> tuple[int, str]:
    """``call_command(name, *args)``: (exit code, stderr), as the shell sees them."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    err = io.StringIO()
    try:
        call_command(name, *args, stderr=err)
    except CommandError as exc:
        return exc.returncode, str(exc)
    except SystemExit as exc:
        return exc.code, err.getvalue()
    return 0, err.getvalue()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--interval", "0"), "--interval must be a finite number > 0 s, got 0"),
        (("--interval", "nan"), "--interval must be a finite number > 0 s, got nan"),
        (("--interval", "inf"), "--interval must be a finite number > 0 s, got inf"),
        (("--batch", "0"), "--batch must be a whole number >= 1, got 0"),
        (("--batch", "-1"), "--batch must be a whole number >= 1, got -1"),
        (("--max-tries", "0"), "--max-tries must be a whole number >= 1, got 0"),
        (("--lock-ms", "0"), "--lock-ms must be a whole number from 100 to 86,400,000 (ms), got 0"),
        (("--lock-ms", "-1"),
         "--lock-ms must be a whole number from 100 to 86,400,000 (ms), got -1"),
        (("--max-stalls", "-1"), "--max-stalls must be a whole number >= 0, got -1"),
        (("--summary-every", "-5"), "--summary-every must be a finite number > 0 s, got -5"),
        (("--summary-every", "0"), "--summary-every must be a finite number > 0 s, got 0"),
        (("--interval", "1e300"), "--interval must be at most 86400 s (a day), got 1e+300"),
        (("--lock-ms", "99999999999999999999"),
         "--lock-ms must be a whole number from 100 to 86,400,000 (ms), got 99999999999999999999"),
        (("--metrics-port", "70000"), "--metrics-port must be a port from 1 to 65535, got 70000"),
        (("--metrics-port", "0"), "--metrics-port must be a port from 1 to 65535, got 0"),
        (("--metrics-host", "0.0.0.0"), "--metrics-host applies with --metrics-port only"),
    ],
)  # fmt: skip
def test_runpump_refuses_a_flag_that_breaks_its_rule(args, message):
    """Before Redis: no server is named (the settings' URL is never asked;
    --no-wait makes a check moved after it fail instead of wait)."""
    assert run_command("runpump", "q", "--no-wait", *args) == (1, f"runpump: {message}")


@pytest.mark.parametrize("flag", [("--pump-interval", "2"), ("--no-mirror",)])
def test_runworker_refuses_a_pump_flag_without_pump(r, db, flag):
    code, err = run_command("runworker", "q", "--burst", *flag)
    assert (code, err) == (1, f"runworker: {flag[0]} applies with --pump only\n")


def test_runworker_passes_pump_interval_on_with_pump(r, db, monkeypatch):
    """Its default, PUMP_INTERVAL_S, is the one docs/reference/commands.md gives."""
    from pathlib import Path

    from echomq_django.management.commands.runworker import PUMP_INTERVAL_S
    from echomq_django.runners.pump import Pump

    commands_md = Path(__file__).parents[1] / "docs" / "reference" / "commands.md"
    [row] = [
        ln for ln in commands_md.read_text().splitlines() if ln.startswith("| `--pump-interval")
    ]
    assert row.endswith(f"| {PUMP_INTERVAL_S} (`PUMP_INTERVAL_S`) |") and PUMP_INTERVAL_S == 1.0
    from echomq_django.runners.worker import Worker

    seen = []
    monkeypatch.setattr(Pump, "run", lambda self, **kw: seen.append(kw["interval"]))
    monkeypatch.setattr(Worker, "run", lambda self, **kw: None)
    assert run_command("runworker", "q", "--pump", "--pump-interval", "2")[0] == 0
    assert run_command("runworker", "q", "--pump")[0] == 0
    assert seen == [2.0, 1.0]  # (with --burst, sweeps take turns with bursts: no interval)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--concurrency", "0"), "--concurrency must be a whole number >= 1, got 0"),
        (("--block-timeout", "nan"), "--block-timeout must be a finite number > 0 s, got nan"),
        (("--sweep-interval", "inf"), "--sweep-interval must be a finite number > 0 s, got inf"),
        (("--sweep-interval", "0"), "--sweep-interval must be a finite number > 0 s, got 0"),
        (
            ("--shutdown-timeout", "nan"),
            "--shutdown-timeout must be a finite number >= 0 s, got nan",
        ),
        (("--lease-ms", "0"),
         "--lease-ms must be a whole number from 1 to 31,536,000,000 (ms), got 0"),
        (("--block-timeout", "1e300"),
         "--block-timeout must be at most 86400 s (a day), got 1e+300"),
        (("--shutdown-timeout", "90000"),
         "--shutdown-timeout must be at most 86400 s (a day), got 90000"),
        (("--metrics-port", "-1"), "--metrics-port must be a port from 1 to 65535, got -1"),
    ],
)  # fmt: skip
def test_runworker_names_the_flag_that_breaks_its_rule(args, message):
    """Before Redis (--burst: a check moved after it would fail, not wait)."""
    assert run_command("runworker", "q", "--burst", *args) == (1, f"runworker: {message}\n")


def test_runworker_refuses_max_jobs_below_one(r, db):
    code, err = run_command("runworker", "q", "--max-jobs", "-1")
    assert (code, err) == (1, "runworker: --max-jobs must be a whole number >= 1, got -1\n")


def test_runworker_refuses_max_stalls_below_zero_and_passes_it_on(r, db, monkeypatch):
    code, err = run_command("runworker", "q", "--max-stalls", "-1")
    assert (code, err) == (1, "runworker: --max-stalls must be a whole number >= 0, got -1\n")
    from echomq_django.runners.worker import Worker

    seen = []
    monkeypatch.setattr(Worker, "run", lambda self, **kw: seen.append(self.timers.max_stalls))
    assert run_command("runworker", "q", "--max-stalls", "5", "--burst")[0] == 0
    assert seen == [5]


@pytest.mark.parametrize("command", ["runworker", "runpump"])
def test_the_commands_say_a_cluster_node_needs_cluster(command, redis_cluster, monkeypatch):
    from echomq_django import conf

    monkeypatch.setenv("ECHOMQ_URL", redis_cluster.url)
    conf.reset()
    try:
        code, err = run_command(command, "q", "--once" if command == "runpump" else "--burst")
    finally:
        conf.reset()
    assert code == 1
    assert err.startswith(
        f"{command}: {redis_cluster.url}: this is a Redis Cluster node: set CLUSTER"
    )


@pytest.mark.parametrize("wait", [False, True], ids=["burst", "waiting"])
def test_a_db_index_out_of_range_is_reported_as_itself(redis_server, monkeypatch, wait):
    """A worker that would wait for Redis does not wait out a settings error:
    the server answers, and says the DB index is wrong."""
    from echomq_django import conf

    url = redis_server.replace("/0", "/99")
    monkeypatch.setenv("ECHOMQ_URL", url)
    conf.reset()
    try:
        code, err = run_command("runworker", "q", *([] if wait else ["--burst"]))
    finally:
        conf.reset()
    assert code == 1
    assert err.startswith(f"runworker: DB index is out of range: {url} selects db 99")


def test_runworker_warns_once_when_periodic_jobs_have_no_pump(redis_server, db, caplog):
    """Periodic jobs fire only under a pump: ``runworker`` alone says so at
    start, once, naming the entries; not when a live pump serves the queue
    (docs/howto/periodic.md)."""
    import logging

    from django.conf import settings
    from django.test import override_settings

    from echomq_django import conf
    from echomq_django.protocol.presence import ProcessInfo

    cfg = {
        **settings.ECHOMQ,
        "SCHEDULE": {
            "tick": {"name": "t.echo", "queue": "sq", "every_s": 3600},
            "elsewhere": {"name": "t.echo", "queue": "other", "every_s": 3600},
        },
    }
    with override_settings(ECHOMQ=cfg):
        conf.reset()
        try:
            with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
                assert run_command("runworker", "sq", "--burst")[0] == 0
            warned = [r.getMessage() for r in caplog.records if "periodic jobs" in r.getMessage()]
            assert warned == [
                "runworker: periodic jobs tick (queue sq) fire only under a pump, and no live "
                "pump serves their queues: run `manage.py runpump sq` or `runworker --pump`"
            ]
            mq = conf.get_mq()
            now = mq.clock()
            pump = ProcessInfo("p1", "pump", "h", 1, ["sq"], now, now, now, mq.keys.prefix)
            mq.presence.beat(pump, 60)
            caplog.clear()
            try:
                with caplog.at_level(logging.WARNING, logger="echomq_django.worker"):
                    assert run_command("runworker", "sq", "--burst")[0] == 0
            finally:
                mq.presence.leave("p1")
            assert not [r for r in caplog.records if "periodic jobs" in r.getMessage()]
        finally:
            conf.reset()


def test_runworker_burst_with_pump_finishes_a_cross_queue_flow(r, db, caplog):
    """``--burst --pump`` runs bursts and pump sweeps in turn: the children's
    burst, the sweep that delivers their results to the parent on another
    queue, the parent's burst (docs/howto/testing.md#runworker---burst-in-scripts-and-ci).
    A single burst left the parent ``awaiting_children`` and exited 0."""
    from echomq_django import Flow, JobState
    from echomq_django.conf import get_mq

    mq = get_mq()
    kids = [Flow("kids", "t.echo", n, job_id=f"c{n}") for n in (1, 2, 4)]
    mq.add_flow(Flow("q", "t.sum_children", job_id="p", children=kids))
    with caplog.at_level(logging.INFO, logger="echomq_django.worker"):
        assert run_command("runworker", "q", "kids", "--burst", "--pump", "--no-mirror")[0] == 0
    parent = mq.get_job("q", "p")
    assert (parent.state, parent.result) == (JobState.COMPLETED, 7)
    assert mq.counts("kids")["completed"] == 3
    # the last burst ran nothing: the command's own line gives the totals
    last = caplog.records[-1].getMessage()
    assert last.startswith("burst with pump done: processed 4 jobs in ")


@pytest.mark.parametrize(
    "args",
    [
        ("runworker", "q", "--burst"),
        ("runworker", "q", "--max-jobs", "0"),
        ("runpump", "q", "--once", "--no-mirror"),
        ("runpump", "q", "--batch", "0"),
    ],
)
def test_a_command_called_in_process_leaves_the_callers_signal_handlers(r, db, args):
    """``StartSignals`` takes SIGTERM and SIGINT while the command runs and
    puts the caller's back however it ends (here exit 0 or 1)."""
    import signal

    def mine(signum, frame):
        return None

    before = {sig: signal.signal(sig, mine) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        code = run_command(*args)[0]
        after = {sig: signal.getsignal(sig) for sig in before}
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert code == (0 if "--burst" in args or "--once" in args else 1)
    assert after == {signal.SIGTERM: mine, signal.SIGINT: mine}
