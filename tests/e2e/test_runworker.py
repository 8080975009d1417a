"""``manage.py runworker`` as a real subprocess against the test Redis:
flows end to end (with ``runpump`` for cross-queue),
SIGTERM, a second signal, SIGKILL and recovery, Redis unreachable at start,
and ``--metrics-port`` serving a scrape."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import redis

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.runners.pump import Pump
from echomq_django.testing.redis_server import server_binary
from tests.support.rigs import free_port
from tests.support.workerkit import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("subprocess_db")]

REPO = Path(__file__).resolve().parents[2]


class Command:
    """``manage.py <args>`` in the background; stdout and stderr go to files."""

    def __init__(self, tmp_path: Path, url: str, *args: str, db: Path | None = None) -> None:
        self.name = args[0]
        self.out = tmp_path / f"{self.name}-{os.urandom(3).hex()}.err"
        with open(self.out, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", *args],
                cwd=REPO,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                env={
                    **os.environ,
                    "PYTHONFAULTHANDLER": "1",  # SIGABRT dumps every thread's stack
                    "ECHOMQ_URL": url,
                    **({"ECHOMQ_DB_PATH": str(db)} if db else {}),
                },
            )

    def stderr(self) -> str:
        return self.out.read_text()

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGABRT)  # the stacks say where it hangs
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
            raise AssertionError(f"{self.name} did not exit:\n{self.stderr()}") from None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory) -> Path:
    """A migrated SQLite file for the commands: they check echomq_django's
    tables at start and warn when ``migrate`` was not run."""
    path = tmp_path_factory.mktemp("db") / "db.sqlite3"
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=REPO,
        env={**os.environ, "ECHOMQ_DB_PATH": str(path)},
        check=True,
    )
    return path


@pytest.fixture
def run(tmp_path, redis_server, migrated_db):
    started: list[Command] = []

    def start(*args: str, url: str = redis_server) -> Command:
        started.append(Command(tmp_path, url, *args, db=migrated_db))
        return started[-1]

    yield start
    for command in started:
        command.stop()


@pytest.fixture
def mq(r):
    return EchoMQ(r, prefix="emq")


# a worker stopped by a second signal with one job running (its stderr's last line, and
# the WARNING before it that counts each kind)
STOPPED_RUNNING = (
    "runworker: stopped with 1 jobs unreported (still running, or finished while Redis did "
    "not answer; the WARNING above counts each); their leases will expire and they run again"
)
WARNED_RUNNING = (
    "stopped with 1 jobs unreported (1 still running, 0 finished and not reported: Redis did "
    "not answer); their leases will expire and they run again (a worker's or the pump's "
    "timers recover them)"
)


def active(mq, job_id: str, queue: str = "q") -> bool:
    return mq.get_job(queue, job_id).state is JobState.ACTIVE


def test_unreachable_redis_at_start_exits_1_with_a_one_line_reason(run):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    worker = run("runworker", "q", "--burst", url=f"redis://127.0.0.1:{port}/0")
    assert worker.wait() == 1
    err = worker.stderr()
    assert err.count("\n") == 1
    assert err.startswith(f"runworker: Redis is unreachable at redis://127.0.0.1:{port}/0: ")
    assert err.endswith("Connection refused.\n")


def test_a_burst_worker_runs_a_same_queue_flow_with_a_line_per_job(run, mq):
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[Flow("q", "t.echo", i, job_id=f"c{i}") for i in range(5)],
        )
    )
    worker = run("runworker", "q", "--burst", "--concurrency", "4", "--verbosity", "2")
    assert worker.wait() == 0
    parent = mq.get_job("q", "p")
    assert (parent.state, parent.result) == (JobState.COMPLETED, 10)
    line = re.compile(r"job (\S+ \(\S+\)) completed in [0-9.]+ ms$", re.MULTILINE)
    per_job = line.findall(worker.stderr())
    assert sorted(per_job) == [
        "q/c0 (t.echo)",
        "q/c1 (t.echo)",
        "q/c2 (t.echo)",
        "q/c3 (t.echo)",
        "q/c4 (t.echo)",
        "q/p (t.sum_children)",
    ]


def test_verbosity_0_prints_nothing_for_a_clean_run(run, mq):
    mq.enqueue("q", "t.echo", 1, job_id="e")
    worker = run("runworker", "q", "--burst", "--verbosity", "0")
    assert worker.wait() == 0
    assert worker.stderr() == ""
    assert mq.get_job("q", "e").state is JobState.COMPLETED


def test_a_cross_queue_flow_completes_with_runpump(run, mq):
    queues = ("orders", "validation", "inventory")
    mq.add_flow(
        Flow(
            "orders",
            "t.sum_children",
            job_id="o",
            children=[
                Flow(
                    "validation",
                    "t.sum_children",
                    job_id="v",
                    children=[Flow("inventory", "t.echo", i, job_id=f"i{i}") for i in range(1, 4)],
                ),
                Flow("orders", "t.echo", 100, job_id="local"),
            ],
        )
    )
    pump = run("runpump", *queues, "--interval", "0.1", "--no-mirror")
    worker = run("runworker", *queues, "--concurrency", "2")
    wait_for(lambda: mq.get_job("orders", "o").state is JobState.COMPLETED, 30, "the flow")
    # on one server the worker resolves a cross-queue parent itself, so the flow can complete
    # while the pump still imports Django, before its command has a SIGTERM handler
    wait_for(lambda: "pump started" in pump.stderr(), 30, "the pump's start")
    for command in (worker, pump):
        command.signal(signal.SIGTERM)
        assert command.wait() == 0, command.stderr()
    assert mq.get_job("validation", "v").result == 6
    assert mq.get_job("orders", "o").result == 106


# A job that sleeps ``payload`` seconds, by pool: the same stop rules hold on
# each (docs/howto/async-handlers.md#the-async-pool: a coroutine on the async pool).
SLEEPERS = [
    pytest.param(("thread", "t.slow"), id="thread"),
    pytest.param(("async", "t.async_sleep"), id="async"),
]


@pytest.mark.parametrize("pool", SLEEPERS)
def test_sigterm_lets_the_running_job_finish_and_exits_0(run, mq, pool):
    mq.enqueue("q", pool[1], 1.0, job_id="s")
    worker = run("runworker", "q", "--pool", pool[0])
    wait_for(lambda: active(mq, "s"), what="the claim")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr()
    job = mq.get_job("q", "s")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 1.0, 1)
    # the job is active in Redis a moment before the worker holds it: a signal
    # then counts 0 running jobs, and the job still runs (once seen in CI)
    assert re.search(
        r"SIGTERM: no more claims; finishing [01] running jobs \(up to 30s\); send it "
        r"again to stop at once",
        worker.stderr(),
    ), worker.stderr()


def test_sigterm_waits_for_a_written_off_handler_then_exits_1_at_the_deadline(run, mq):
    """A handler past its time limit is waited for within --shutdown-timeout
    (docs/explanation/reliability.md#stopping-a-worker); still running at the
    deadline, the process exits at once (its thread would hold a normal exit
    for as long as the handler runs: t.block, 30 s)."""
    mq.enqueue("q", "t.block", job_id="b", timeout_ms=100, max_attempts=1)
    worker = run("runworker", "q", "--shutdown-timeout", "1")
    wait_for(lambda: mq.get_job("q", "b").state is JobState.DEAD, what="the time limit")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=20) == 1
    err = worker.stderr()
    # (the dead job may not have left the worker's held set yet: 0 or 1 running)
    assert re.search(
        r"SIGTERM: no more claims; finishing [01] running jobs and 1 handlers past their "
        r"time limit \(up to 1s\); send it again to stop at once",
        err,
    ), err
    assert (
        "runworker: stopped with 1 handlers past their time limit still running; exiting "
        "cuts them off"
    ) in err


@pytest.mark.parametrize("pool", SLEEPERS)
def test_a_second_signal_stops_at_once_leaving_the_lease(run, mq, pool):
    mq.enqueue("q", pool[1], 20.0, job_id="s")
    worker = run("runworker", "q", "--pool", pool[0])
    wait_for(lambda: active(mq, "s"), what="the claim")
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: no more claims" in worker.stderr(), what="the first stop")
    worker.signal(signal.SIGINT)
    assert worker.wait() == 1
    lines = worker.stderr().splitlines()
    assert lines[-1] == STOPPED_RUNNING
    assert any(ln.endswith(WARNED_RUNNING) for ln in lines)
    assert active(mq, "s")


def test_after_sigkill_the_pump_recovers_the_job_and_the_flow_completes_once(run, mq):
    mq.add_flow(
        Flow(
            "q",
            "t.sum_children",
            job_id="p",
            children=[
                Flow("q", "t.slow", 1.0, job_id="slow"),
                Flow("q", "t.echo", 2, job_id="fast"),
            ],
        )
    )
    worker = run("runworker", "q", "--concurrency", "2", "--lease-ms", "1000")
    wait_for(lambda: active(mq, "slow") and mq.get_job("q", "fast").result == 2, what="claims")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    lease_end = mq.client.zscore(mq.keys.queue_key("q", "active"), "slow")
    wait_for(lambda: mq.clock() > lease_end, what="the lease to expire")
    assert Pump(["q"], mq=mq).sweep()["q"]["recovered"] == 1
    second = run("runworker", "q", "--burst", "--concurrency", "2")
    assert second.wait() == 0
    parent = mq.get_job("q", "p")
    assert (parent.state, parent.result, parent.attempts) == (JobState.COMPLETED, 3.0, 1)
    assert mq.get_job("q", "slow").attempts == 2
    assert mq.dependency_counts("q", "p")["remaining"] == 0
    assert len(mq.children_values("q", "p")) == 2
    events = [(f[b"e"], f[b"id"]) for _, f in mq.client.xrange(mq.keys.queue_key("q", "events"))]
    assert events.count((b"released", b"p")) == 1
    assert events.count((b"completed", b"slow")) == 1
    assert events.count((b"completed", b"p")) == 1


def _children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid`` (from /proc)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended


def test_a_killed_process_pool_worker_takes_its_handler_processes_with_it(run, mq):
    """SIGKILL the worker while a handler process runs a 30 s job: every
    handler process ends within seconds, so none runs on beside the rerun
    another worker makes once the lease lapses
    (docs/howto/process-pool.md#a-worker-that-dies)."""
    mq.enqueue("q", "t.slow", 30.0, job_id="long")
    worker = run("runworker", "q", "--pool", "process", "--concurrency", "2")
    wait_for(lambda: active(mq, "long"), what="the claim")
    handlers = wait_for(lambda: _children(worker.proc.pid), what="the handler processes")
    worker.signal(signal.SIGKILL)
    assert worker.wait() == -signal.SIGKILL
    wait_for(lambda: not any(_alive(pid) for pid in handlers), timeout=10,
             what="the handler processes to end with their worker")  # fmt: skip


def test_runworker_alone_runs_a_site_with_pump_delays_and_retries(run, mq):
    """docs/explanation/no-polling.md: one ``runworker --pump`` process, nothing else; every wait is
    far longer than the test, so each job ran on a wake-up or a timer."""
    mq.add_flow(Flow("orders", "t.sum_children", job_id="o", children=[Flow("kids", "t.echo", 4)]))
    mq.enqueue("orders", "t.echo", "later", job_id="d", delay_ms=300)
    mq.enqueue("orders", "t.flaky", {"fail_times": 1}, job_id="f", backoff_ms=200)
    never = "3600"
    worker = run(
        "runworker",
        "orders",
        "kids",
        "--pump",
        "--no-mirror",
        *("--pump-interval", never, "--sweep-interval", never, "--block-timeout", never),
    )
    for queue, job_id in (("orders", "o"), ("orders", "d"), ("orders", "f")):
        wait_for(lambda q=queue, j=job_id: mq.get_job(q, j).state is JobState.COMPLETED, 30, job_id)
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.stderr()
    assert mq.get_job("orders", "o").result == 4
    assert mq.get_job("orders", "f").result == {"attempt": 2}


@pytest.mark.parametrize(
    "flag, value, rule",
    [
        ("--sweep-interval", "0", "a finite number > 0 s, got 0"),
        ("--pump-interval", "-1", "a finite number > 0 s, got -1"),
        ("--block-timeout", "0", "a finite number > 0 s, got 0"),
        ("--shutdown-timeout", "-5", "a finite number >= 0 s, got -5"),
    ],
)
def test_runworker_refuses_a_bad_time_flag_by_name(run, flag, value, rule):
    worker = run("runworker", "q", flag, value)
    assert worker.wait() == 1
    assert worker.stderr() == f"runworker: {flag} must be {rule}\n"


# -- --metrics-port -------------------------------------------------------------


def test_runworker_serves_metrics_and_lists_itself(tmp_path, redis_server, r):
    mq = EchoMQ(r, prefix="emq")
    port = free_port()
    mq.enqueue("served", "t.echo", {"n": 1})
    worker = Command(
        tmp_path, redis_server, "runworker", "served", "--metrics-port", str(port), "-v", "0"
    )
    try:
        url = f"http://127.0.0.1:{port}/metrics"

        def scrape() -> str:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return response.read().decode()
            except OSError:
                return ""

        wait_for(
            lambda: 'echomq_jobs_completed_total{name="t.echo",queue="served"} 1.0' in scrape(),
            what="the completed job in the worker's metrics",
        )
        text = scrape()
        assert 'echomq_queue_jobs{queue="served",state="completed"} 1.0' in text
        assert 'echomq_processes_live{kind="worker"} 1.0' in text
        [info] = mq.presence.live_processes()
        assert (info.kind, info.pid, info.queues) == ("worker", worker.proc.pid, ["served"])
        worker.signal(signal.SIGTERM)
        assert worker.wait() == 0, worker.stderr()
    finally:
        worker.stop()
    assert mq.presence.live_processes() == []


def test_runworker_with_a_taken_metrics_port_is_one_line(tmp_path, redis_server):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = Command(tmp_path, redis_server, "runworker", "q", "--metrics-port", str(port))
        assert worker.wait() == 1
    line = worker.stderr().strip().splitlines()[-1]  # (warnings may come before it)
    assert line.startswith(f"runworker: cannot serve metrics on 127.0.0.1:{port}: ")


# -- started before Redis ------------------------------------------------------


def _redis_on(port: int) -> subprocess.Popen:
    """A bare redis-server on ``port`` (what a site's Redis does when it boots last)."""
    proc = subprocess.Popen(
        [server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    client = redis.Redis(port=port)
    wait_for(lambda: _pings(client), what="the late redis-server to answer")
    return proc


def _pings(client) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.mark.parametrize("command", ["runworker", "runpump"])
def test_a_runner_started_before_redis_waits_for_it_and_comes_up_with_it(run, command):
    """No Redis at start: the runner logs one line per try, the wait doubling
    from 0.5 s, instead of exiting; once Redis answers it says so once and
    works; SIGTERM then stops it cleanly."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    runner = (
        run(command, "q", "--interval", "0.1", url=url)
        if command == "runpump"
        else (run(command, "q", url=url))
    )
    tries = re.compile(rf"Redis unreachable at {re.escape(url)} \(.*\), retrying in ([\d.]+)s")
    wait_for(lambda: len(tries.findall(runner.stderr())) >= 3, what="three tries", timeout=20)
    server = _redis_on(port)
    try:
        mq = EchoMQ(redis.Redis(port=port), prefix="emq")
        if command == "runworker":
            mq.enqueue("q", "t.echo", "late", job_id="j")
            wait_for(lambda: mq.get_job("q", "j").state is JobState.COMPLETED, what="the job")
        else:
            mq.enqueue("q", "t.echo", "later", job_id="j", delay_ms=1)
            wait_for(lambda: mq.get_job("q", "j").state is JobState.PENDING, what="a sweep")
        runner.signal(signal.SIGTERM)
        assert runner.wait() == 0, runner.stderr()
    finally:
        server.kill()
        server.wait()
    err = runner.stderr()
    delays = [float(d) for d in tries.findall(err)]
    assert delays[:3] == [0.5, 1.0, 2.0], err
    assert err.count(f"Redis reachable again at {url}") == 1, err


def test_sigterm_while_waiting_for_redis_stops_at_once_with_exit_0(run):
    url = f"redis://127.0.0.1:{free_port()}/0"
    worker = run("runworker", "q", url=url)
    wait_for(lambda: "retrying in" in worker.stderr(), what="the first try")
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=5) == 0, worker.stderr()
    assert "SIGTERM while starting: stopping" in worker.stderr()


def test_no_wait_exits_1_at_once_when_redis_is_not_up(run):
    url = f"redis://127.0.0.1:{free_port()}/0"
    worker = run("runworker", "q", "--no-wait", url=url)
    assert worker.wait() == 1
    assert worker.stderr().startswith(f"runworker: Redis is unreachable at {url}: ")


def children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s child processes (Linux)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_pool_process_a_sigterm_to_every_process_lets_the_running_job_finish(run, mq):
    """systemd's default stop (SIGTERM to every process of the service) is
    one graceful stop: the handler processes ignore it, the worker finishes
    the running job and exits 0 (docs/howto/process-pool.md#stopping)."""
    mq.enqueue("q", "t.slow", 1.0, job_id="s")
    worker = run("runworker", "q", "--pool", "process", "--concurrency", "2")
    wait_for(lambda: active(mq, "s"), what="the claim")
    children = children_of(worker.proc.pid)
    assert len(children) == 2
    for pid in [worker.proc.pid, *children]:
        os.kill(pid, signal.SIGTERM)
    assert worker.wait() == 0
    job = mq.get_job("q", "s")
    assert (job.state, job.result, job.attempts) == (JobState.COMPLETED, 1.0, 1)
    assert "SIGTERM: no more claims; finishing 1 running jobs" in worker.stderr()
    assert not any(os.path.exists(f"/proc/{pid}") for pid in children)


def test_pool_process_a_second_signal_stops_at_once_and_ends_the_handler_process(run, mq):
    mq.enqueue("q", "t.slow", 20.0, job_id="s")
    worker = run("runworker", "q", "--pool", "process")
    wait_for(lambda: active(mq, "s"), what="the claim")
    (child,) = children_of(worker.proc.pid)
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "SIGTERM: no more claims" in worker.stderr(), what="the first stop")
    worker.signal(signal.SIGINT)
    assert worker.wait() == 1
    assert worker.stderr().splitlines()[-1] == STOPPED_RUNNING
    assert active(mq, "s")  # left to its lease
    wait_for(lambda: not os.path.exists(f"/proc/{child}") or _zombie(child),
             timeout=5, what="the handler process to end")  # fmt: skip


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
