"""Blocking instead of polling: the wake-ups a runner waits for, and the timers a worker runs
(docs/explanation/house.md, "runners/"). The markers themselves, and the commands that
read and write them, are ``protocol/timers.py``'s.

* ``Waker`` blocks on one of those keys per queue (``BZPOPMIN``, with a
  timeout) and posts each marker it pops to its runner as a ``Wake``. On one
  server a single thread blocks on every queue's key in one command; on a
  Redis Cluster one thread per queue blocks on that queue's key, routed to
  the node of its slot (a blocking command over two slots would be refused).
  It blocks only while armed: the runner arms it when it could use a wake-up
  (a free handler slot, not one held for a claim riding a completion), and
  each pop disarms it, so a busy worker leaves the markers to idle ones; a
  marker its runner cannot use after all (busy again, stopping) goes back
  with ``put_back``. A dropped connection
  (Redis restart, failover) is retried with backoff; the runner gets
  ``DOWN`` then ``UP`` and claims every queue once it is back, so
  nothing claimable while it was away waits for a wake-up.
  A worker's operator commands (``commands``: its key, on its first
  queue's slot) ride on the first group's ``BZPOPMIN``: idle, it hears them
  at no extra cost; disarmed for ``QUIET_S`` (busy), that thread blocks on
  the command key alone, and ``arm()`` nudges it back to the markers
  (docs/howto/operate-workers.md#how-it-works).
* ``Timers`` (``runners/timers.py``): the timers a worker keeps, which
  ``Idle`` runs between its waits.
* ``Linger``: how long a busy worker's loop waits for more finished jobs
  before it hands over the ones it holds
  (docs/explanation/no-polling.md#lingering-for-batch-mates).

An idle worker's commands (docs/explanation/no-polling.md#what-an-idle-worker-costs):
one ``BZPOPMIN`` per ``block_s`` per blocking connection and one look per
``sweep_s`` (on a Cluster one of each per queue), whatever the number of
its queues.
"""

from __future__ import annotations

import logging
import queue as _queue
import threading
import time

from ..core.exceptions import RedisUnavailable
from ..protocol.control.commands import NUDGE
from ..protocol.timers import SOCKET_MARGIN_S, WAKE_DUE, Wake
from .outage import BACKOFF_MAX_S, BACKOFF_START_S  # a waker's tries while Redis is away
from .timers import Timers

log = logging.getLogger("echomq_django.wake")

BLOCK_S = 4.0  # longest single BZPOPMIN (s): bounds a lost reply's cost, not latency
CUT_AGAIN_S = 0.05  # a stop cuts the waker's connections again this often until it ends (s)
QUIET_S = 1.0  # disarmed this long (busy), the waker hears commands on their key alone (s)

DOWN, UP = Wake("", "down"), Wake("", "up")  # what a Waker posts when Redis goes and comes back
LINGER_S = 0.001  # longest wait for a quick finished job's batch-mates (s)
LINGER_REST_S = 0.1  # after a wait that ran its whole LINGER_S, no wait for this long (s)


class Inbox:
    """What a runner's loop waits on (the worker's finished jobs and
    wake-ups, the pump's wake-ups): ``put(item)`` from any thread, and on
    the loop's one thread ``get(timeout)`` (s; None: no end), ``get_nowait()``
    and ``empty()``; ``get`` and ``get_nowait`` raise ``queue.Empty`` as a
    queue does. The items are a ``SimpleQueue``'s (the fastest put), the
    wait a bare ``Lock``'s, held while nothing rings and released by a put
    to wake the loop: on CPython before 3.13 a ``SimpleQueue.get(timeout)``
    on the main thread turns into a wait without end when a signal handler
    runs past its deadline, and a runner's loop runs on the main thread,
    where every SIGTERM lands (docs/explanation/no-polling.md); a lock's
    timed acquire recomputes its deadline after a handler, and hands over
    in about half an ``Event``'s time (one lock, where an ``Event`` wakes
    through a condition and a lock of its own:
    docs/explanation/performance.md#the-loops-bell)."""

    __slots__ = ("_bell", "_items", "_sleeping", "empty", "get_nowait")

    def __init__(self) -> None:
        self._items: _queue.SimpleQueue = _queue.SimpleQueue()
        self._bell = threading.Lock()
        self._bell.acquire()  # held: released, it rings once
        self._sleeping = False  # the loop is (about to be) waiting on the bell
        self.get_nowait, self.empty = self._items.get_nowait, self._items.empty

    def put(self, item) -> None:
        """Add ``item``; wakes the loop when it waits."""
        self._items.put(item)
        if self._sleeping:  # read after the put: a loop that missed the item hears the bell
            try:
                self._bell.release()
            except RuntimeError:  # rung already, not heard yet: once is enough
                pass

    def get(self, timeout: float | None = None):
        """The oldest item, waiting up to ``timeout`` s for one."""
        try:
            return self._items.get_nowait()
        except _queue.Empty:
            if timeout is not None and timeout <= 0:
                raise
        deadline = None if timeout is None else time.monotonic() + timeout
        self._sleeping = True  # set before the look below: a put after it rings
        try:
            while True:
                try:
                    return self._items.get_nowait()
                except _queue.Empty:
                    left = -1 if deadline is None else deadline - time.monotonic()
                    if deadline is not None and left <= 0:
                        raise
                # a ring left from an earlier wait returns at once: the look above
                # runs again, finds nothing, and the next acquire waits
                self._bell.acquire(timeout=left)
        finally:
            self._sleeping = False


class Linger:
    """When a worker's loop, holding finished jobs, waits for more before it
    hands them to the reporter (docs/explanation/no-polling.md#lingering-for-batch-mates).

    A claim's jobs run side by side, and on a busy machine their threads post
    their ends some hundreds of µs apart: a loop that hands over the first
    ones alone sends a small report and then a small claim for their slots,
    two round trips for a few jobs. So the loop waits for more, up to
    ``LINGER_S`` after it first found its inbox empty, while every job in
    hand is quick (its handler ran under ``LINGER_S``), other jobs of its own
    still run, and under half its room is free. A wait that ran its whole
    ``LINGER_S`` (what still runs is slow, or its threads wait for a core) is
    not tried again for ``LINGER_REST_S``: a worker loses at most one such
    wait, ``LINGER_S``, in every ``LINGER_REST_S``; a wait that ends sooner
    ended because what it waited for came. The loop's one thread calls
    ``begin`` as a hand-over starts and ``more`` each time its inbox is empty."""

    __slots__ = ("_end", "_rest_until", "_seen", "_slow", "_until")

    def __init__(self) -> None:
        self._rest_until = 0.0  # monotonic s: no wait before this
        self.begin(0.0)

    def begin(self, end: float) -> None:
        """A hand-over starts: no wait past ``end`` (monotonic s: the loop's next timer)."""
        self._end, self._until = end, None
        self._seen, self._slow = 0, False  # finished jobs looked at; one ran LINGER_S or more

    def more(self, inbox: Inbox, finished: list, freed: int, executing: int, room: int):
        """The next item of ``inbox`` while the wait lasts; raises ``queue.Empty``
        when it is over (or was never on). ``finished``: the ``reporter.Finished``
        in hand; ``freed``: slots given back in hand; ``executing``: the worker's
        jobs not handed over, those in hand included; ``room``: the jobs it takes at
        once (``ClaimLoop.room``)."""
        for f in finished[self._seen :]:
            self._slow = self._slow or f.ms >= LINGER_S * 1000
        self._seen, held = len(finished), len(finished) + freed
        if not finished or self._slow or executing <= held or 2 * held >= room:
            raise _queue.Empty  # before the clock: most hand-overs end here
        now = time.monotonic()
        if self._until is None:
            if now < self._rest_until:
                raise _queue.Empty
            self._until = now + LINGER_S
        try:
            return inbox.get(timeout=min(self._until, self._end) - now)
        except _queue.Empty:  # ran out: a whole wait rests, one cut by the timer does not
            if self._until <= self._end:
                self._rest_until = time.monotonic() + LINGER_REST_S
            raise


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
        deadline = time.monotonic() + self.block_s + SOCKET_MARGIN_S
        for thread in self._threads:
            while thread is not threading.current_thread() and thread.is_alive():
                if time.monotonic() >= deadline:
                    break
                # a thread that connected as the cut came blocks on a socket the cut
                # did not see: cut again until it has ended
                thread.join(CUT_AGAIN_S)
                self.markers.cut()

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


def own_past(loop, queue: str) -> bool:
    """Whether ``loop`` (a ``ClaimLoop``) holds a job of ``queue``, running or
    finished and unreported, whose lease deadline has passed: its heartbeat
    could not extend it (an outage). The timers' recovery waits for it
    (``Timers.own_past``)."""
    now = loop.mq.clock()
    return any(
        job.queue == queue and job.lease_deadline is not None and job.lease_deadline < now
        for job in loop.claims.jobs()
    )


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
            loop.mq,
            loop.queues,
            sweep_s=sweep_s,
            max_stalls=max_stalls,
            leases=loop.leases,
            settled=lambda: not loop.reporter.unreported,
            own_past=lambda queue: own_past(loop, queue),
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
            if w.executing + w.fetching >= w.concurrency or w.stopping.is_set():
                # busy after all (a slot held for a riding claim is not free), or
                # leaving: another idle worker may take it now;
                # this one claims from the queue as soon as a thread frees
                self.wakeups["returned"] += 1
                self.waker.put_back(wake)
