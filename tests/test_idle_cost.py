"""What an idle worker costs Redis
(docs/explanation/no-polling.md#what-an-idle-worker-costs): every command
it sends, read with MONITOR on the private server, for a worker on one
queue and one on five (each under a prefix of its own, both at once).

The fast test shrinks the intervals and checks what an idle worker sends:
one blocking command and one look over all its queues, its heartbeat, and
nothing per queue. The e2e test runs the defaults for 20 s and checks the
goal: at most one command per second, whatever the number of queues."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from echomq_django import EchoMQ, Worker
from echomq_django.protocol.timers import WATCHED
from tests.support.workerkit import Background, wait_for

PREFIXES = {"idle1": ["q"], "idle5": ["q0", "q1", "q2", "q3", "q4"]}
# what an idle worker may send: its blocking pop, the look, the heartbeat and its upkeep
IDLE_COMMANDS = {"BZPOPMIN", "EXISTS", "SET", "ZADD", "ZREMRANGEBYSCORE", "ZREMRANGEBYRANK",
                 "HSET", "HLEN"}  # fmt: skip


class Monitor:
    """Every command the server runs while open, by prefix: ``{prefix:
    [[command, arg, ...], ...]}`` (a command belongs to the prefix its
    first key carries)."""

    def __init__(self, client) -> None:
        self.client, self.seen = client, {p: [] for p in PREFIXES}
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(5)

    def _run(self) -> None:
        with self.client.monitor() as m:
            self._ready.set()
            for entry in m.listen():
                if self._stop.is_set():
                    return
                words = entry["command"].split()
                if len(words) < 2:
                    continue
                prefix = words[1].split(":", 1)[0]
                if prefix in self.seen:
                    self.seen[prefix].append(words)

    def close(self) -> dict[str, list[list[str]]]:
        self._stop.set()
        self.client.ping()  # one more command: the reader sees the stop
        self._thread.join(5)
        return self.seen


def idle_workers(r, **options) -> list[tuple[Worker, Background]]:
    running = []
    for prefix, queues in PREFIXES.items():
        worker = Worker(queues, mq=EchoMQ(r, prefix=prefix), **options)
        running.append((worker, Background(worker)))
    for worker, _ in running:
        wait_for(lambda w=worker: w.waiting, what="an idle worker")
    return running


def stop(running) -> None:
    for worker, background in running:
        worker.stop()
        background.join()


def test_an_idle_worker_sends_nothing_per_queue(r) -> None:
    running = idle_workers(r, block_timeout=0.2, sweep_interval=0.2, beat_s=0.2)
    try:
        time.sleep(0.5)  # past the first sweeps and the first (upkeep) beat
        monitor = Monitor(r)
        time.sleep(2.0)
        seen = monitor.close()
    finally:
        stop(running)
    for prefix, queues in PREFIXES.items():
        names = Counter(words[0].upper() for words in seen[prefix])
        assert set(names) <= IDLE_COMMANDS, names
        assert names["BZPOPMIN"] >= 2 and names["EXISTS"] >= 2, names
        wake_keys = {f"{prefix}:{{{q}}}:wake" for q in queues}
        looks = [w for w in seen[prefix] if w[0].upper() == "EXISTS"]
        pops = [w for w in seen[prefix] if w[0].upper() == "BZPOPMIN"]
        # every queue's watched keys in one look; every wake key in one blocking
        # pop, with the worker's command key (docs/howto/operate-workers.md#how-it-works)
        assert {len(w) - 1 for w in looks} == {len(queues) * len(WATCHED)}, looks[:2]
        commands = {k for w in pops for k in w[1:-1] if ":commands:" in k}
        assert len(commands) == 1 and commands.pop().startswith(f"{prefix}:{{{queues[0]}}}:")
        assert all(set(w[1:-1]) - {k for k in w[1:-1] if ":commands:" in k} == wake_keys
                   for w in pops), pops[:2]  # fmt: skip


@pytest.mark.e2e
def test_an_idle_worker_sends_at_most_one_command_a_second(r) -> None:
    """The defaults: block 4 s, sweep 10 s, heartbeat 15 s (its upkeep one
    beat in four): about 0.5 commands a second for one queue or five."""
    running = idle_workers(r)
    try:
        time.sleep(3.0)  # the first sweeps and the first (upkeep) beat are behind
        monitor = Monitor(r)
        window = 20.0
        time.sleep(window)
        seen = monitor.close()
    finally:
        stop(running)
    rates = {prefix: len(seen[prefix]) / window for prefix in PREFIXES}
    assert all(0 < rate <= 1.0 for rate in rates.values()), (rates, seen)
