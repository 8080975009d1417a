"""The process pool (``Worker(pool="process")``, ``runworker --pool
process``), on both rigs: a job runs in a child process; a child past its
job's time limit is killed and replaced; a child that dies fails only its own
attempt, with its exit code or signal; children are recycled after N jobs or
past a memory limit; a handler a child cannot import fails its job and the
pool stays up; bad settings are refused before anything starts."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from echomq_django import EchoMQ, JobState, Worker, handler
from echomq_django.core.jobs import Job
from echomq_django.handlers import _registry
from echomq_django.runners.control import autoscale
from echomq_django.runners.processes import supervisor
from echomq_django.runners.processes.child import rss_bytes
from echomq_django.runners.processes.supervisor import TERM_GRACE_S, ProcessPool
from echomq_django.runners.timeouts import Timeouts
from tests.support.workerkit import Background, wait_for
from tests.test_runner_commands import run_command

pytestmark = pytest.mark.e2e


@handler("pp.pid")
def pid(job):
    """Returns the pid of the process that ran it."""
    return os.getpid()


@handler("pp.exit")
def exit_now(job):
    """Ends its process at once with exit code ``payload`` (no cleanup)."""
    os._exit(job.payload)


@handler("pp.sigkill")
def sigkill(job):
    """Its process SIGKILLs itself, as the out-of-memory killer would."""
    os.kill(os.getpid(), signal.SIGKILL)


@handler("pp.hang")
def hang(job):
    """Blocks SIGTERM and sleeps ``payload`` seconds: only SIGKILL ends it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    time.sleep(job.payload)
    return "woke"


@handler("pp.grow")
def grow(job):
    """Keeps ``payload`` MiB alive in its process, returns its pid."""
    grow.kept = [*getattr(grow, "kept", []), bytearray(job.payload << 20)]
    return os.getpid()


@handler("pp.mark")
def mark(job):
    """Appends its pid to the file ``payload`` (a line per run); returns it."""
    with open(job.payload, "a") as f:
        f.write(f"{os.getpid()}\n")
    return os.getpid()


@handler("pp.gate")
def gate(job):
    """Blocks until the test writes to the FIFO ``payload["fifo"]``, then
    exits with code 3 (``"then": "exit"``) or returns its pid."""
    with open(job.payload["fifo"]) as f:
        f.read()
    if job.payload["then"] == "exit":
        os._exit(3)
    return os.getpid()


_started: list = []  # (worker, Background) of this test: stopped after it, whatever its end


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test():
    """A test that fails before its ``stop`` leaves no worker behind: its
    handler processes would claim the next tests' jobs on the same rig."""
    yield
    while _started:
        worker, bg = _started.pop()
        if bg.thread.is_alive():
            worker.stop()
            bg.thread.join(30)


def start(mq, concurrency=1, **kw):
    worker = Worker(["q"], concurrency=concurrency, mq=mq, pool="process", block_timeout=0.2, **kw)
    bg = Background(worker)
    _started.append((worker, bg))
    wait_for(lambda: worker.loop.pool is not None and len(worker.loop.pool.pids()) == concurrency,
             what="the children")  # fmt: skip
    return worker, bg


def pipes() -> int:
    """This process's open pipe descriptors (a handler process's pipes; the
    sockets a Redis client may open meanwhile are not counted)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:")
        except FileNotFoundError:  # closed since the listing
            pass
    return count


def finished(mq, job_id):
    return mq.get_job("q", job_id).state in (JobState.COMPLETED, JobState.DEAD)


def stop(worker, bg):
    worker.stop()
    bg.join()


def test_a_job_runs_in_a_child_process(mq) -> None:
    worker, bg = start(mq, concurrency=2)
    children = set(worker.loop.pool.pids())
    for i in range(6):
        mq.enqueue("q", "pp.pid", job_id=f"p{i}")
    wait_for(lambda: mq.counts("q")["completed"] == 6, what="six jobs")
    ran_in = {mq.get_job("q", f"p{i}").result for i in range(6)}
    assert os.getpid() not in ran_in
    assert ran_in <= children
    stop(worker, bg)
    assert worker.stats == {"completed": 6, "failed": 0, "dead": 0, "lost": 0, "postponed": 0}
    assert all(not os.path.exists(f"/proc/{p}") for p in children)  # reaped, gone


def test_a_hung_child_is_killed_within_its_time_limit_and_replaced(mq) -> None:
    worker, bg = start(mq, concurrency=2)
    before = set(worker.loop.pool.pids())
    mq.enqueue("q", "pp.hang", 60, job_id="h", timeout_ms=300, max_attempts=1)
    wait_for(lambda: mq.get_job("q", "h").started_at, what="the hang to start")
    began = time.monotonic()
    wait_for(lambda: finished(mq, "h"), what="the hang to time out")
    job = mq.get_job("q", "h")
    assert (job.state, job.error) == (
        JobState.DEAD,
        "TimeoutError: the attempt ran longer than its time limit of 300 ms "
        "(timeout_ms / TIMEOUT_MS); its handler process was ended (SIGTERM, then SIGKILL)",
    )
    wait_for(lambda: worker.loop.timeouts.stuck == 0, what="the SIGKILL")
    assert time.monotonic() - began < 0.3 + TERM_GRACE_S + 1.0  # a bound, from a wait
    after = worker.loop.pool.pids()
    assert len(after) == 2 and len(set(after) - before) == 1  # one fresh child
    mq.enqueue("q", "pp.pid", job_id="next")
    wait_for(lambda: finished(mq, "next"), what="a job after the kill")
    assert mq.get_job("q", "next").result in after
    stop(worker, bg)
    assert worker.pool_kind == "process" and worker.left_running == 0


def test_hung_jobs_in_a_row_leave_the_pool_at_its_size_and_no_descriptor_behind(mq) -> None:
    worker, bg = start(mq, concurrency=2)
    pool, fds = worker.loop.pool, []
    for batch in range(3):  # the first batch brings the Redis pool to its size
        for i in range(4):
            mq.enqueue("q", "pp.hang", 60, job_id=f"h{batch}{i}", timeout_ms=50, max_attempts=1)
        wait_for(lambda n=batch: mq.counts("q")["dead"] == 4 * (n + 1), what="timed-out jobs")
        wait_for(lambda: pool.leaving == 0, what="the last SIGKILL")
        fds.append(pipes())
    assert (len(pool.pids()), pool.busy, pool.replaced) == (2, 0, 0)  # ended, not died
    assert fds[1] == fds[2], fds  # no pipe left behind per ended process
    assert worker.loop.timeouts.stuck == 0  # never counted stuck: max_stuck does not apply
    assert all(mq.get_job("q", f"h2{i}").error.endswith("its handler process was ended "
               "(SIGTERM, then SIGKILL)") for i in range(4))  # fmt: skip
    stop(worker, bg)


def test_a_child_that_exits_fails_only_its_own_attempt(mq) -> None:
    worker, bg = start(mq, concurrency=2)
    mq.enqueue("q", "pp.exit", 3, job_id="x", max_attempts=1)
    mq.enqueue("q", "pp.pid", job_id="ok")
    wait_for(lambda: finished(mq, "x") and finished(mq, "ok"), what="both jobs")
    error = mq.get_job("q", "x").error
    assert error.startswith("HandlerProcessDied: the handler process (pid ")
    assert error.endswith(") exited with exit code 3 while it ran this job; a fresh handler "
                          "process took its place")  # fmt: skip
    assert mq.get_job("q", "ok").state is JobState.COMPLETED
    wait_for(lambda: len(worker.loop.pool.pids()) == 2, what="the pool back to 2")
    assert worker.loop.pool.replaced == 1
    stop(worker, bg)
    assert worker.stats["dead"] == 1 and worker.stats["completed"] == 1


def test_a_sigkilled_child_names_the_signal_and_the_job_retries(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "pp.sigkill", job_id="k", max_attempts=2, backoff_ms=0)
    wait_for(lambda: finished(mq, "k"), what="two killed attempts")
    job = mq.get_job("q", "k")
    assert job.attempts == 2 and job.state is JobState.DEAD
    assert "was ended by signal SIGKILL (9) (the kernel's out-of-memory killer sends SIGKILL " \
           "too) while it ran this job" in job.error  # fmt: skip
    stop(worker, bg)
    assert worker.stats == {"completed": 0, "failed": 1, "dead": 1, "lost": 0, "postponed": 0}


def test_children_are_recycled_after_max_jobs_per_child(mq) -> None:
    worker, bg = start(mq, max_jobs_per_child=2)
    for i in range(6):
        mq.enqueue("q", "pp.pid", job_id=f"p{i}")
    wait_for(lambda: mq.counts("q")["completed"] == 6, what="six jobs")
    pids = [mq.get_job("q", f"p{i}").result for i in range(6)]
    # one child at a time, two jobs each, in claim order
    assert pids[0] == pids[1] and pids[2] == pids[3] and pids[4] == pids[5]
    assert len(set(pids)) == 3
    wait_for(lambda: worker.loop.pool.recycled == 3, what="the third recycle")
    stop(worker, bg)


def test_a_child_past_max_memory_per_child_is_recycled_after_its_job(mq) -> None:
    limit = rss_bytes() // (1 << 20) + 100  # MiB: a forked child starts near its parent's
    worker, bg = start(mq, max_memory_per_child=limit)
    mq.enqueue("q", "pp.grow", 10, job_id="small")
    wait_for(lambda: finished(mq, "small"), what="the small job")
    mq.enqueue("q", "pp.grow", 150, job_id="big")
    wait_for(lambda: finished(mq, "big"), what="the big job")
    mq.enqueue("q", "pp.grow", 1, job_id="after")
    wait_for(lambda: finished(mq, "after"), what="the job after")
    got = {j: mq.get_job("q", j) for j in ("small", "big", "after")}
    assert all(j.state is JobState.COMPLETED for j in got.values())  # the big one finished
    assert got["small"].result == got["big"].result != got["after"].result
    assert worker.loop.pool.recycled == 1
    stop(worker, bg)


def test_a_limit_below_a_fresh_childs_size_recycles_every_job_and_warns_once(mq, caplog) -> None:
    """A ``max_memory_per_child`` a fresh child already exceeds makes every
    child leave after one job (the jobs still complete); the supervisor
    says why once, naming the figures and the fix."""
    worker, bg = start(mq, max_memory_per_child=1)  # 1 MiB: below any Python process
    with caplog.at_level("WARNING", logger="echomq_django.worker"):
        for i in range(3):
            mq.enqueue("q", "pp.pid", job_id=f"r{i}")
        wait_for(lambda: mq.counts("q")["completed"] == 3, what="three jobs")
        wait_for(lambda: worker.loop.pool.recycled == 3, what="the third recycle")
    said = [r.getMessage() for r in caplog.records if "after its first job" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith("a handler process held ")
    assert said[0].endswith(
        "MiB after its first job, over max_memory_per_child (1 MiB): a fresh process is about "
        "as large, so each leaves after one job and the pool forks for every job; set "
        "--max-memory-per-child above a fresh process's size"
    )
    assert len({mq.get_job("q", f"r{i}").result for i in range(3)}) == 3  # three children
    stop(worker, bg)


def test_a_handler_the_child_cannot_import_fails_its_job_and_the_pool_stays_up(mq) -> None:
    worker, bg = start(mq)

    def ghost(job):
        return "never"

    ghost.__module__, ghost.__qualname__ = "tests.no_such_module", "ghost"
    handler("pp.ghost")(ghost)  # registered in the worker after its child forked
    try:
        mq.enqueue("q", "pp.ghost", job_id="g", max_attempts=1)
        wait_for(lambda: finished(mq, "g"), what="the ghost job")
        error = mq.get_job("q", "g").error
        assert error.splitlines()[0] == (
            "ModuleNotFoundError: the handler of job name 'pp.ghost' "
            "(tests.no_such_module:ghost) cannot be imported in the handler process: "
            "No module named 'tests.no_such_module'"
        )
        mq.enqueue("q", "pp.pid", job_id="after")
        wait_for(lambda: finished(mq, "after"), what="a job after it")
        assert mq.get_job("q", "after").state is JobState.COMPLETED
        assert worker.loop.pool.replaced == 0
    finally:
        _registry.pop("pp.ghost", None)
        stop(worker, bg)


def _signals_set(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGINT and catches SIGTERM
    (/proc/<pid>/status: SigIgn and SigCgt, hex masks, bit n-1 for signal n)."""
    with open(f"/proc/{pid}/status") as fh:
        masks = dict(line.split(":\t", 1) for line in fh if line.startswith("Sig"))
    ignored, caught = int(masks["SigIgn"], 16), int(masks["SigCgt"], 16)
    return bool(ignored >> (signal.SIGINT - 1) & 1 and caught >> (signal.SIGTERM - 1) & 1)


def test_a_graceful_stop_lets_the_running_child_finish(mq) -> None:
    worker, bg = start(mq)
    mq.enqueue("q", "t.slow", 0.5, job_id="s")
    wait_for(lambda: mq.get_job("q", "s").started_at, what="the job to start")
    child = worker.loop.pool.pids()[0]
    # its own handlers are set once forked (a signal before then meets the
    # worker's, inherited: SIGTERM would end it): SIGINT ignored, SIGTERM caught
    wait_for(lambda: _signals_set(child), what="the handler process's signal handlers")
    os.kill(child, signal.SIGTERM)  # as systemd's control-group stop would: ignored
    os.kill(child, signal.SIGINT)  # as a terminal's Ctrl-C would: ignored
    worker.stop()
    assert bg.join() == 1
    assert (mq.get_job("q", "s").state, mq.get_job("q", "s").result) == (JobState.COMPLETED, 0.5)
    assert worker.abandoned == 0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"pool": "fork"}, "pool must be one of thread, process, async, got 'fork'"),
        ({"pool": "process", "max_jobs_per_child": 0},
         "max_jobs_per_child must be an integer >= 1, got 0"),
        ({"pool": "process", "max_memory_per_child": -5},
         "max_memory_per_child must be an integer >= 1, got -5"),
        ({"max_jobs_per_child": 3},
         "max_jobs_per_child applies to the process pool only (pool='process')"),
    ],
)  # fmt: skip
def test_bad_pool_settings_are_refused(redis_client, kw, message) -> None:
    with pytest.raises(ValueError) as err:
        Worker(["q"], mq=EchoMQ(redis_client), **kw)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--pool", "fork"), "--pool must be one of thread, process, async, got 'fork'"),
        (("--pool", "process", "--max-jobs-per-child", "0"),
         "--max-jobs-per-child must be a whole number >= 1, got 0"),
        (("--pool", "process", "--max-memory-per-child", "0"),
         "--max-memory-per-child must be a whole number >= 1, got 0"),
        (("--pool", "process", "--max-memory-per-child", "-1"),
         "--max-memory-per-child must be a whole number >= 1, got -1"),
        (("--max-jobs-per-child", "5"), "--max-jobs-per-child applies to --pool process only"),
    ],
)  # fmt: skip
def test_runworker_refuses_a_bad_pool_flag(r, db, args, message) -> None:
    assert run_command("runworker", "q", "--burst", *args) == (1, f"runworker: {message}\n")


def test_runworker_pool_process_burst_runs_the_jobs_in_children(r, db) -> None:
    mq = EchoMQ(r)
    for i in range(4):
        mq.enqueue("q", "pp.pid", job_id=f"c{i}")
    code, _ = run_command("runworker", "q", "--burst", "--pool", "process", "--concurrency", "2",
                          "--max-jobs-per-child", "1")  # fmt: skip
    assert code == 0
    pids = {mq.get_job("q", f"c{i}").result for i in range(4)}
    assert len(pids) == 4 and os.getpid() not in pids  # a fresh child for each job


@pytest.mark.parametrize("pool", ["thread", "process"])
def test_autoscale_grows_to_max_under_a_backlog_and_shrinks_to_min_when_idle(mq, pool) -> None:
    worker = Worker(["q"], mq=mq, pool=pool, autoscale=(8, 1), block_timeout=0.2,
                    sweep_interval=0.1)  # fmt: skip
    worker.loop.scale.shrink_after_s = 0.3  # the loop wakes every sweep interval
    assert worker.concurrency == 1
    for i in range(64):
        mq.enqueue("q", "t.slow", 0.02, job_id=f"s{i}")
    sizes = []
    bg = Background(worker)
    wait_for(lambda: sizes.append(worker.loop.concurrency) or mq.counts("q")["completed"] == 64,
             what="the backlog")  # fmt: skip
    assert max(sizes) == 8 and worker.loop.scale.grown == 3  # 1 -> 2 -> 4 -> 8
    if pool == "process":
        wait_for(lambda: len(worker.loop.pool.pids()) == 1, what="back to one handler process")
    else:
        wait_for(lambda: len(worker.loop.pool._threads) == 1, what="back to one thread")
    wait_for(lambda: worker.loop.concurrency == 1, what="back to one handler")
    assert worker.loop.scale.shrunk == 3  # 8 -> 4 -> 2 -> 1: halving, no flapping
    stop(worker, bg)
    assert worker.stats["completed"] == 64


def test_an_idle_pool_is_woken_for_its_next_shrink(mq) -> None:
    """The loop's wait ends at the next shrink (Autoscale.next_in), not at
    the next sweep: with a 60 s sweep, an idle 8-handler pool is back to 1
    three shrink waits after its backlog."""
    worker = Worker(["q"], mq=mq, autoscale=(8, 1), block_timeout=0.2, sweep_interval=60)
    worker.loop.scale.shrink_after_s = 0.3
    scale = worker.loop.scale
    assert scale.next_in(scale.full_at + 0.1, 8) == pytest.approx(0.2)
    assert scale.next_in(scale.full_at + 1, 8) == 0.0 and scale.next_in(0.0, 1) == float("inf")
    for i in range(64):
        mq.enqueue("q", "t.slow", 0.02, job_id=f"n{i}")
    bg = Background(worker)
    wait_for(lambda: mq.counts("q")["completed"] == 64, what="the backlog")
    idle_at = time.monotonic()
    wait_for(lambda: worker.loop.concurrency == 1, what="back to one handler", timeout=10)
    assert time.monotonic() - idle_at < 5  # three 0.3 s waits, not a 60 s sweep
    stop(worker, bg)


@pytest.mark.parametrize(("text", "parsed"), [("8,1", (8, 1)), ("4,4", (4, 4))])
def test_autoscale_flag_parses_max_min(text, parsed) -> None:
    assert autoscale.parse(text) == parsed


@pytest.mark.parametrize("text", ["2,8", "0,0", "8", "8,1,1", "a,b", "8,0"])
def test_runworker_refuses_a_bad_autoscale(r, db, text) -> None:
    assert run_command("runworker", "q", "--burst", "--autoscale", text) == (
        1,
        f"runworker: --autoscale must be MAX,MIN with MAX >= MIN >= 1, got {text!r}\n",
    )


@handler("pp.refuse")
def refuse(job):
    """Raises ``payload``: ``"value"`` a ValueError, else ``Retry(after_ms=700)``."""
    from echomq_django import Retry

    if job.payload == "value":
        raise ValueError("not a number")
    raise Retry(700)


def test_the_retry_policy_is_decided_in_the_child_with_the_exception(redis_client) -> None:
    """A handler process decides a failed attempt by the job's retry policy
    (docs/howto/retries.md), as the thread pool does: a ValueError the queue
    does not retry dies at once, attempts left; ``Retry(700)`` waits exactly
    700 ms."""
    queues = {
        "q": {"MAX_ATTEMPTS": 5, "BACKOFF_MS": 60_000, "DONT_RETRY_ON": ["builtins.ValueError"]}
    }
    mq = EchoMQ(redis_client, prefix="emq", queues=queues)
    worker, bg = start(mq)
    try:
        before = mq.clock()
        mq.enqueue("q", "pp.refuse", "value", job_id="v")
        mq.enqueue("q", "pp.refuse", "retry", job_id="r")
        wait_for(lambda: finished(mq, "v"), what="the ValueError's job")
        wait_for(lambda: mq.get_job("q", "r").state == JobState.DELAYED, what="the retry")
    finally:
        stop(worker, bg)
    dead = mq.get_job("q", "v")
    assert (dead.state, dead.attempts, dead.error.splitlines()[0]) == (
        JobState.DEAD,
        1,
        "ValueError: not a number",
    )
    due = int(redis_client.zscore(mq.keys.queue("q").delayed, "r"))
    started = mq.get_job("q", "r").started_at
    # 700 ms after the attempt failed, not the queue's backoff of 60 s
    assert (mq.get_job("q", "r").attempts, 700 <= due - started < 30_000, before <= started) == (
        1,
        True,
        True,
    )


# -- jobs queued in a child's pipe (docs/howto/process-pool.md#how-it-works) ----
@pytest.fixture
def bare_pool(monkeypatch):
    """``make(size, **kw)``: a ``ProcessPool`` without a worker, every
    child quick (a job may queue behind any running one), and its time
    limits as a worker's: a job past its limit is recorded (``timed_out``,
    ids) and its child ended. Returns ``(pool, done, timed_out)``."""
    monkeypatch.setattr(supervisor, "QUICK_MS", 60_000.0)
    made = []

    def make(size, **kw):
        timed_out: list[str] = []
        timeouts = Timeouts(lambda job, limit: (timed_out.append(job.id), pool.write_off(job)))
        threading.Thread(target=timeouts.run, daemon=True).start()
        pool = ProcessPool(size, "pp-bare", timeouts=timeouts, time_limits={"q": None}, **kw)
        made.append((pool, timeouts))
        return pool, queue.SimpleQueue(), timed_out

    yield make
    for pool, timeouts in made:
        pool.shutdown(wait=False)
        timeouts.close()


def outcomes(done, *ids):
    """The ``Finished`` of each job of ``ids`` from ``done`` (None items,
    for attempts failed already, are skipped), as ``{id: Finished}``."""
    got = {}
    while set(got) != set(ids):
        item = done.get(timeout=15)
        if item is not None:
            got[item.job.id] = item
    return got


def queued(pool):
    """How many jobs wait in each child's pipe behind its running one."""
    with pool._lock:
        return [len(c.next) for c in pool._working]


def warm(pool, done) -> int:
    """Run one job so the first child has a last job (quick); its pid."""
    pool.start(Job("warm", "q", "pp.pid"), done)
    return outcomes(done, "warm")["warm"].result


def release(fifo) -> None:
    with open(fifo, "w") as f:
        f.write("go")


def test_a_job_queued_behind_a_hung_one_runs_in_the_fresh_child_exactly_once(bare_pool, tmp_path):
    pool, done, timed_out = bare_pool(1)  # no idle child to take it back to
    first, marks = warm(pool, done), tmp_path / "marks"
    pool.start(Job("h", "q", "pp.hang", 60, timeout_ms=200), done)
    pool.start(Job("m", "q", "pp.mark", str(marks)), done)
    assert wait_for(lambda: queued(pool) == [1], what="m behind h")
    got = outcomes(done, "m")["m"]  # h's child was ended: m never began there
    assert (got.error, got.result != first) == (None, True)
    assert marks.read_text().split() == [str(got.result)]  # once, in the fresh child
    assert (timed_out, pool.pids()) == (["h"], [got.result])


def test_a_child_that_dies_hands_its_queued_job_to_another(bare_pool, tmp_path):
    pool, done, _ = bare_pool(1)
    first, marks, fifo = warm(pool, done), tmp_path / "marks", tmp_path / "fifo"
    os.mkfifo(fifo)
    pool.start(Job("x", "q", "pp.gate", {"fifo": str(fifo), "then": "exit"}), done)
    pool.start(Job("m", "q", "pp.mark", str(marks)), done)
    wait_for(lambda: queued(pool) == [1], what="m behind x")
    release(fifo)  # x's child exits with code 3 before it reads m
    got = outcomes(done, "x", "m")
    assert got["x"].error == (f"HandlerProcessDied: the handler process (pid {first}) exited "
                              "with exit code 3 while it ran this job; a fresh handler process "
                              "took its place")  # fmt: skip
    assert (got["m"].error, got["m"].result != first) == (None, True)
    assert marks.read_text().split() == [str(got["m"].result)]
    assert pool.replaced == 1


def test_a_queued_job_starts_its_time_limit_when_it_starts(bare_pool, tmp_path):
    """A hung job behind a running one: its limit (200 ms) starts when the
    job before it replies, not when it was queued (the one before runs
    longer than that); it is then killed, and the job queued behind it
    runs in the fresh child."""
    pool, done, timed_out = bare_pool(1)
    first, marks, fifo = warm(pool, done), tmp_path / "marks", tmp_path / "fifo"
    os.mkfifo(fifo)
    pool.start(Job("g", "q", "pp.gate", {"fifo": str(fifo), "then": "return"}), done)
    pool.start(Job("h", "q", "pp.hang", 60, timeout_ms=200), done)
    pool.start(Job("m", "q", "pp.mark", str(marks)), done)
    wait_for(lambda: queued(pool) == [2], what="h and m behind g")
    time.sleep(0.5)  # past h's limit, had it started when queued
    assert timed_out == []
    release(fifo)
    got = outcomes(done, "g", "m")
    assert (got["g"].error, got["g"].result) == (None, first)  # its child was not ended
    assert (got["m"].error, got["m"].result != first) == (None, True)
    assert marks.read_text().split() == [str(got["m"].result)]
    assert timed_out == ["h"]


def test_a_child_recycled_after_a_job_hands_on_the_job_queued_behind(bare_pool, tmp_path):
    limit = rss_bytes() // (1 << 20) + 100  # MiB: a forked child starts near its parent's
    pool, done, _ = bare_pool(1, max_memory_per_child=limit << 20)
    first, marks = warm(pool, done), tmp_path / "marks"
    pool.start(Job("big", "q", "pp.grow", 150), done)
    pool.start(Job("m", "q", "pp.mark", str(marks)), done)
    got = outcomes(done, "big", "m")
    assert (got["big"].error, got["big"].result) == (None, first)  # it finished its job
    assert (got["m"].error, got["m"].result != first) == (None, True)  # m: not read there
    assert marks.read_text().split() == [str(got["m"].result)]
    assert pool.recycled == 1


def test_a_job_queued_behind_a_long_one_moves_to_an_idle_child_and_is_skipped(bare_pool, tmp_path):
    """A job queued behind one that runs past ``STALL_S`` goes to an idle
    child; the first child, once free, skips it (it runs once) and runs
    the next job it is given."""
    pool, done, _ = bare_pool(2)
    first, marks, fifo = warm(pool, done), tmp_path / "marks", tmp_path / "fifo"
    os.mkfifo(fifo)
    pool.start(Job("g", "q", "pp.gate", {"fifo": str(fifo), "then": "return"}), done)
    pool.start(Job("m", "q", "pp.mark", str(marks)), done)
    got = outcomes(done, "m")  # while g still runs
    assert (got["m"].error, got["m"].result != first) == (None, True)
    release(fifo)
    got.update(outcomes(done, "g"))
    assert (got["g"].error, got["g"].result) == (None, first)
    pool.start(Job("after", "q", "pp.mark", str(marks)), done)  # the first idle child
    assert outcomes(done, "after")["after"].result == first
    assert marks.read_text().split() == [str(got["m"].result), str(first)]  # m ran once
