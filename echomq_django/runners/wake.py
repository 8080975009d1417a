"""Blocking instead of polling: the wake-ups and the timers a runner keeps
(docs/explanation/house.md, "runners/"). The markers themselves, and the commands that
read and write them, are ``protocol/timers.py``'s.

* ``Waker`` blocks on one of those keys per queue (``BZPOPMIN``, with a
  timeout) and posts each marker it pops to its runner as a ``Wake``. On one
  server a single thread blocks on every queue's key in one command; on a
  Redis Cluster one thread per queue blocks on that queue's key, routed to
  the node of its slot (a blocking command over two slots would be refused).
  It blocks only while armed: the runner arms it when it could use a wake-up
  (a free thread and every queue drained), and each pop disarms it, so a busy
  worker leaves the markers to idle ones; a marker its runner cannot use after
  all (busy again, stopping) goes back with ``put_back``. A dropped connection
  (Redis restart, failover) is retried with backoff; the runner gets
  ``DOWN`` then ``UP`` and claims every queue once it is back, so
  nothing claimable while it was away waits for a wake-up.
  A worker's operator commands (``commands``: its key, on its first
  queue's slot) ride on the first group's ``BZPOPMIN``: idle, it hears them
  at no extra cost; disarmed for ``QUIET_S`` (busy), that thread blocks on
  the command key alone, and ``arm()`` nudges it back to the markers
  (docs/howto/operate-workers.md#how-it-works).
* ``Timers``: the timers a worker keeps for its queues, so ``runworker``
  alone runs a site (periodic jobs aside): it promotes due delayed jobs at
  their run-at (learnt from ``'d'`` markers and from its sweeps); it
  recovers expired leases one millisecond past the earliest lease deadline
  it read, or a lease after its last look when nothing was active (a job
  leased later expires no sooner), so a dead worker's job is back within a
  second of its deadline (docs/explanation/reliability.md#leases-and-recovery);
  it kills held parents at their ``children_timeout_ms`` deadline; and
  every ``sweep_s`` seconds the first worker of a queue to take the queue's
  short lock (``P:{q}:timers:lock``, it expires, never released: at most
  one sweep per queue per interval however many workers run) reads the
  next delayed run-at, lease and children deadlines, and re-wakes a queue
  that has pending jobs (a marker lost with a killed worker costs at most
  one interval). The recovery and expiry scripts move only what is past
  due, atomically, so workers firing together move each job once.

Both threads' Redis commands are counted for an idle worker: one
``BZPOPMIN`` per ``block_s`` per blocking connection, and per queue one
``SET NX`` per ``sweep_s`` plus four reads for the worker holding the lock,
and a recovery call and a read per lease (``LEASE_MS``) while nothing is
active.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from ..core.exceptions import RedisUnavailable
from ..core.jobs import Outcome
from ..protocol.control.commands import NUDGE
from ..protocol.timers import SOCKET_MARGIN_S, WAKE_DUE, Wake

log = logging.getLogger("echomq_django.wake")

BLOCK_S = 4.0  # longest single BZPOPMIN (s): bounds a lost reply's cost, not latency
SWEEP_S = 10.0  # a queue's sweep interval (s): lease recovery, next run-at, lost markers
BACKOFF_START_S, BACKOFF_MAX_S = 0.5, 30.0
QUIET_S = 1.0  # disarmed this long (busy), the waker hears commands on their key alone (s)

DOWN, UP = Wake("", "down"), Wake("", "up")  # what a Waker posts when Redis goes and comes back


class Waker:
    """Blocks on ``key`` (the ``QueueKeys`` field ``"wake"`` or
    ``"outbox_wake"``) of each of ``queues`` and calls ``post(Wake)`` for each
    marker popped (see the module).

    ``mq``: an ``EchoMQ``; ``block_s`` (s): longest single blocking command
    (bounded below the client's socket timeout); ``name``: thread name;
    ``commands``: the worker's command key (posted as command ``Wake``s), or None.
    ``start()``, ``arm()`` (block for the next wake-up), ``disarm()``,
    ``put_back(wake)``, ``stop()``. Thread-safe; ``post`` runs on a waker
    thread and must not block.
    """

    def __init__(
        self,
        mq,
        queues,
        key: str,
        post,
        *,
        block_s: float = BLOCK_S,
        name="echomq-waker",
        commands=None,
    ):
        self.mq, self.key, self.post, self.name = mq, key, post, name
        self.queues = list(queues)
        self._armed = threading.Event()
        self._halt = threading.Event()
        self._threads: list[threading.Thread] = []
        self.markers = mq.timers.markers(self.queues, key, block_s, commands)
        self._listening = False  # blocked on the command key alone (busy)
        self.block_s = self.markers.block_s
        self.groups = self.markers.groups

    def start(self) -> None:
        for i, group in enumerate(self.groups):
            thread = threading.Thread(
                target=self._run, args=(group,), daemon=True, name=f"{self.name}-{i}"
            )
            thread.start()
            self._threads.append(thread)

    def arm(self) -> None:
        """Block for the next wake-up (a no-op while armed)."""
        if self._armed.is_set():
            return
        self._armed.set()
        if self._listening:  # blocked on commands alone: back to the markers now
            try:
                self.markers.nudge()
            except Exception as err:  # it comes back within block_s anyway
                log.debug("%s: nudging the command wait failed: %s", self.name, err)

    def disarm(self) -> None:
        """Leave markers to others (a command already blocked may still pop one)."""
        self._armed.clear()

    @property
    def armed(self) -> bool:
        return self._armed.is_set()

    def stop(self) -> None:
        """Stop blocking, and return once the threads have: a thread blocked
        in Redis is cut off at once (its connection refuses to come back),
        and one that popped a marker as the stop came puts it back before it
        ends, so what the caller hands back after this is not taken again.
        A shared client that cannot be cut (``Markers``) costs at most
        ``block_s``."""
        self._halt.set()
        self._armed.set()
        self.markers.cut()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(self.block_s + SOCKET_MARGIN_S)

    def put_back(self, wake: Wake) -> None:
        """Return a popped marker for another runner (``'d'`` keeps the
        earliest run-at). Errors are logged, not raised: at worst a sweep
        re-wakes the queue."""
        try:
            self.markers.put_back(wake)
        except Exception as err:  # also a connection cut off under us by stop()
            log.debug(
                "putting back %s on %s of %s failed: %s", wake.member, self.key, wake.queue, err
            )

    def _run(self, queues: list[str]) -> None:
        order, turn, down, delay = list(queues), 0, False, BACKOFF_START_S
        listens = self.markers.commands is not None and queues == self.groups[0]
        while not self._halt.is_set():
            armed = self._armed.wait(QUIET_S if listens else None)
            if self._halt.is_set():
                return
            if armed:
                turn = (turn + 1) % len(order)  # rotate: one busy queue cannot starve the rest
                pop, args = self.markers.pop, (order[turn:] + order[:turn],)
            else:  # busy a while: hear commands alone until armed (arm() nudges)
                self._listening = True
                if self._armed.is_set():  # armed meanwhile, and may not have nudged
                    self._listening = False
                    continue
                pop, args = self.markers.pop_commands, ()
            try:
                wake = pop(*args)
            except Exception as err:  # cut off by stop(), or Redis went away
                self._listening = False
                if self._halt.is_set():
                    return
                if not isinstance(err, RedisUnavailable):
                    log.exception("%s: blocking on %s failed", self.name, self.key)
                if not down:
                    down = True
                    log.warning(
                        "%s: blocking on %s failed (%s); retrying", self.name, self.key, err
                    )
                    self.post(DOWN)
                self._halt.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            self._listening = False
            if down:
                down, delay = False, BACKOFF_START_S
                self.post(UP)
            if wake is None or (wake.command and wake.member == NUDGE):
                continue
            if self._halt.is_set():
                self.put_back(wake)
                return
            if wake.command:  # for the loop; the wait for a wake-up goes on
                self.post(wake)
                continue
            self._armed.clear()
            self.post(wake)


class Timers:
    """A worker's timers for ``queues`` (see the module): ``learn(queue,
    run_at_ms)`` a delayed run-at; ``next_in()`` seconds until the next timer;
    ``run()`` fires what is due and returns the merged ``Outcome`` (recovered
    jobs that died and what that moved; their signals are durable events).

    ``sweep_s`` (s): sweep interval per queue; ``max_stalls``: lease expiries a
    job survives (as the pump's); ``limit``: most jobs moved per script call;
    ``leases``: ``{queue: lease ms}`` this worker claims with (default each
    queue's ``LEASE_MS``): the soonest a job leased after a look at the
    active set can expire, so the next look comes no later
    (docs/explanation/reliability.md#leases-and-recovery).
    Redis errors propagate (the worker waits an outage out).
    """

    def __init__(
        self,
        mq,
        queues,
        *,
        sweep_s: float = SWEEP_S,
        max_stalls: int = 1,
        limit=1000,
        leases: dict[str, int] | None = None,
    ):
        if sweep_s <= 0:
            raise ValueError(f"sweep_s must be > 0 s, got {sweep_s!r}")
        self.mq, self.queues = mq, list(queues)
        self.sweep_s, self.max_stalls, self.limit = float(sweep_s), max_stalls, limit
        leases = leases or {}
        # the shortest lease a job of the queue can have: this worker's, or the setting
        self.leases = {
            q: min(int(leases.get(q) or mq.setting(q, "LEASE_MS")), int(mq.setting(q, "LEASE_MS")))
            for q in self.queues
        }
        self.due: dict[str, int | None] = dict.fromkeys(self.queues)  # earliest run-at (ms)
        # ms: the next look for expired leases (None: at the next sweep), and the
        # earliest children deadline known (None: none known)
        self.lease_at: dict[str, int | None] = dict.fromkeys(self.queues)
        self.expire_at: dict[str, int | None] = dict.fromkeys(self.queues)
        self.sweep_at = dict.fromkeys(self.queues, 0.0)  # monotonic time of the next sweep
        self.token = secrets.token_hex(8)
        self.promoted = self.recovered = self.expired = self.sweeps = 0

    def learn(self, queue: str, run_at: int) -> None:
        if queue in self.due and (self.due[queue] is None or run_at < self.due[queue]):
            self.due[queue] = int(run_at)

    def wake_all(self) -> None:
        """Every timer is due now (after a reconnect)."""
        for queue in self.queues:
            self.sweep_at[queue] = 0.0

    def next_in(self) -> float:
        """Seconds until the next timer is due (0 when one is)."""
        now, ms = time.monotonic(), self.mq.clock()
        waits = [at - now for at in self.sweep_at.values()]
        for timer in (self.due, self.lease_at, self.expire_at):
            waits += [(at - ms) / 1000 for at in timer.values() if at is not None]
        return max(0.0, min(waits))

    def run(self) -> Outcome:
        outcome = Outcome()
        now = time.monotonic()
        for queue in self.queues:
            ms = self.mq.clock()
            due = self.due[queue]
            if due is not None and due <= ms:
                self._promote(queue)
            if self.sweep_at[queue] <= now:
                self._sweep(queue, outcome)
                continue
            if self.lease_at[queue] is not None and self.lease_at[queue] <= ms:
                self._recover(queue, outcome)
            if self.expire_at[queue] is not None and self.expire_at[queue] <= ms:
                self._expire(queue, outcome)
        return outcome

    def _promote(self, queue: str) -> None:
        moved = self.mq.timers.promote_delayed(queue, limit=self.limit)
        self.promoted += moved
        if moved >= self.limit:
            return  # more are due: promote again on the next pass
        self.due[queue] = self.mq.timers.next_run_at(queue)

    def _recover(self, queue: str, outcome: Outcome) -> None:
        """Recover the expired leases of ``queue`` (the script moves only
        what has expired, atomically: a second worker firing at the same
        deadline moves nothing), then look again at the next deadline, or a
        lease from now, whichever comes first."""
        stalled = self.mq.timers.recover_stalled(
            queue, limit=self.limit, max_stalls=self.max_stalls
        )
        self.recovered += stalled.recovered
        outcome.merge(stalled)
        self._next_lease_look(queue, self.mq.timers.oldest_lease(queue))

    def _next_lease_look(self, queue: str, oldest: int | None) -> None:
        # a lease deadline passes when the clock is past it (lua/recover_stalled.lua:
        # deadline < now): one ms after it. A job leased after this look expires no
        # sooner than a lease from now.
        bound = self.mq.clock() + self.leases[queue]
        self.lease_at[queue] = bound if oldest is None else min(oldest + 1, bound)

    def _expire(self, queue: str, outcome: Outcome) -> None:
        """Kill the held parents of ``queue`` past their children deadline
        (atomic, as the pump's), then learn the next deadline."""
        expired, moved = self.mq.timers.expire_children(queue, limit=self.limit)
        self.expired += expired
        outcome.merge(moved)
        self.expire_at[queue] = self.mq.timers.next_children_deadline(queue)

    def _sweep(self, queue: str, outcome: Outcome) -> None:
        self.sweep_at[queue] = time.monotonic() + self.sweep_s
        found = self.mq.timers.sweep(queue, self.token, int(self.sweep_s * 1000))
        if found is None:
            # another worker (perhaps one that died: a restart) swept this queue within
            # the interval; this one's lease and children timers fire at their
            # deadlines all the same, learnt here the first time
            if self.lease_at[queue] is None:
                self._next_lease_look(queue, self.mq.timers.oldest_lease(queue))
                self.expire_at[queue] = self.mq.timers.next_children_deadline(queue)
            return
        self.sweeps += 1
        now = self.mq.clock()
        self.due[queue] = found.next_run_at
        if found.next_run_at is not None and found.next_run_at <= now:
            self._promote(queue)
        if found.oldest_lease is not None and found.oldest_lease < now:
            self._recover(queue, outcome)
        else:
            self._next_lease_look(queue, found.oldest_lease)
        self.expire_at[queue] = found.children_deadline
        if found.children_deadline is not None and found.children_deadline <= now:
            self._expire(queue, outcome)
        if found.claimable:
            self.mq.timers.wake(queue)  # a marker may have been lost
        # retention, queued removals and cancels, bounded per sweep
        outcome.merge(self.mq.lifecycle.prune(queue).outcome)


class Idle:
    """A worker's side of docs/explanation/no-polling.md: its ``Waker`` on the queues' wake
    keys and its ``Timers``. The worker calls ``start(post)`` and ``stop()``
    around a run, ``keep_timers()`` on each pass of its loop, ``block(idle)``
    before each wait (True: arm the waker) and ``on_wake(wake)`` for what
    the waker posted. ``loop`` is the worker's ``ClaimLoop``: it uses its
    ``mq``, ``queues``, ``concurrency``, ``executing``, ``stopping``,
    ``rest`` (queue -> the monotonic time it may be claimed),
    ``on_released(queue)`` and ``commands`` (its command key's owner, or None).
    ``wakeups``: the wake-ups used (``claimable``, ``due``, ``reconnect``, and
    ``returned``: markers handed back while busy or stopping)."""

    def __init__(self, loop, block_s: float, sweep_s: float, max_stalls: int) -> None:
        self.loop, self.block_s = loop, block_s
        self.timers = Timers(
            loop.mq, loop.queues, sweep_s=sweep_s, max_stalls=max_stalls, leases=loop.leases
        )
        self.wakeups = dict.fromkeys(("claimable", "due", "reconnect", "returned"), 0)
        self.waker: Waker | None = None

    def start(self, post) -> None:
        loop = self.loop
        commands = loop.commands.key if loop.commands is not None else None
        self.waker = Waker(
            loop.mq, loop.queues, "wake", post, block_s=self.block_s, commands=commands
        )
        self.waker.start()

    def stop(self) -> None:
        """Stop the waker and hand back what it learnt: each queue's earliest
        delayed run-at goes back as a ``'d'`` marker (it keeps an earlier
        one), so the worker that starts next promotes that job on time
        instead of at its first sweep (the timers lock this worker took
        holds other workers' sweeps off for up to ``sweep_s``)."""
        if self.waker is None:
            return
        self.waker.stop()
        for queue, run_at in self.timers.due.items():
            if run_at is not None:
                self.waker.put_back(Wake(queue, WAKE_DUE, run_at))

    def block(self, idle: bool) -> bool:
        """Arm the waker when ``idle`` (a free thread, every queue drained),
        else leave the markers to other workers; returns ``idle``."""
        if idle:
            self.waker.arm()
        else:
            self.waker.disarm()
        return idle

    def keep_timers(self) -> bool:
        """Run the timers that are due (what a lease recovery moves, a job
        past its stall limit dying, is a durable event: the pump's dispatcher
        sends its signals). True when any ran (they talked to Redis)."""
        if self.timers.next_in() > 0:
            return False
        outcome = self.timers.run()
        for queue, _ in outcome.released:
            self.loop.on_released(queue)
        return True

    def on_wake(self, wake: Wake) -> None:
        """A marker the waker popped, or its connection's state."""
        w = self.loop
        if wake is UP:  # whatever became claimable or due meanwhile: look now
            self.wakeups["reconnect"] += 1
            w.rest.update(dict.fromkeys(w.queues, 0.0))
            self.timers.wake_all()
        elif wake is DOWN:
            return
        elif wake.member == WAKE_DUE:
            self.wakeups["due"] += 1
            self.timers.learn(wake.queue, wake.score)
            if w.stopping.is_set():
                self.waker.put_back(wake)
        else:
            self.wakeups["claimable"] += 1
            w.rest[wake.queue] = 0.0
            if w.executing >= w.concurrency or w.stopping.is_set():
                # busy after all, or leaving: another idle worker may take it now;
                # this one claims from the queue as soon as a thread frees
                self.wakeups["returned"] += 1
                self.waker.put_back(wake)
