"""A worker's side of the operator commands (docs/howto/operate-workers.md;
the protocol is ``protocol/control/commands.py``).

The waker pops a command (``wake.Waker``, with the worker's command key) and
posts it to the claiming loop, which applies it on its own thread, so a
command never races a claim:

* ``shutdown``: the SIGTERM path (``ClaimLoop.stop``): no more claims, the
  running jobs finish within ``shutdown_timeout``;
* ``drain``: no more claims, and the worker returns once every running job
  has finished, however long that takes (``ClaimLoop.drain``);
* ``pool-grow N`` / ``pool-shrink N``: N handlers more or fewer, within the
  bounds: ``--autoscale``'s MAX and MIN, or for a fixed pool 1 and twice
  the size it started with (``bounds``). Autoscaling goes on from the new
  size. A shrink lets running handlers finish their job first.

Each command is replied ``acknowledged`` as it is applied, then ``done``
(a resize at once, naming the sizes; ``shutdown`` / ``drain`` when the
worker's run returns), or ``expired`` when it waited past
``PENDING_TTL_MS``. A reply that cannot be written (Redis away) is logged:
the command is applied all the same.
"""

from __future__ import annotations

import logging

from ...core.exceptions import EchoMQError
from ...protocol.control.commands import Command

log = logging.getLogger("echomq_django.worker")


def bounds(concurrency: int, scale) -> tuple[int, int]:
    """``(low, high)`` handlers a resize stays within: ``scale``'s (an
    ``autoscale.Autoscale``), else 1 and twice ``concurrency`` (the fixed
    pool's starting size)."""
    if scale is not None:
        return scale.low, scale.high
    return 1, 2 * concurrency


class Commands:
    """The commands of the worker ``worker_id`` (listed among the live
    processes), popped from ``key`` (``mq.commands.pending_key``) and applied
    to ``loop`` (its ``ClaimLoop``). ``apply(wake)`` on the loop's thread;
    ``finish()`` once its run returned. ``applied``: the commands applied,
    by name."""

    def __init__(self, mq, worker_id: str, key: str, loop) -> None:
        self.mq, self.worker_id, self.key, self.loop = mq, worker_id, key, loop
        self.low, self.high = bounds(loop.concurrency, loop.scale)
        self.stops: list[Command] = []  # shutdown / drain: done when the run returns
        self.applied = dict.fromkeys(("shutdown", "drain", "pool-grow", "pool-shrink"), 0)

    def apply(self, wake) -> None:
        """Apply the command a waker popped (``wake.member`` its JSON)."""
        cmd = self.mq.commands.decode(wake.member, wake.score)
        if cmd is None:
            log.warning("worker %s: dropped a command that does not decode: %.200s",
                        self.worker_id, wake.member)  # fmt: skip
            return
        if self.mq.commands.expired(cmd):
            self._reply(cmd, ("expired", "it waited too long to be read; not applied"))
            return
        self.applied[cmd.name] += 1
        if cmd.name in ("shutdown", "drain"):
            self._reply(cmd, ("acknowledged", f"{cmd.name}: no more claims"))
            self.stops.append(cmd)
            limit = "" if cmd.name == "drain" else f" (up to {self.loop.shutdown_timeout:.0f}s)"
            log.warning("%s command: no more claims; finishing %d running jobs%s",
                        cmd.name, self.loop.executing, limit)  # fmt: skip
            if cmd.name == "drain":
                self.loop.drain()
            else:
                self.loop.stop()
            return
        size = self.loop.concurrency
        step = cmd.n if cmd.name == "pool-grow" else -cmd.n
        new = max(self.low, min(self.high, size + step))
        if new != size:
            log.info("%s command: %d -> %d handlers", cmd.name, size, new)
            self.loop.resize(new)
        detail = f"{size} -> {new} handlers"
        if new != size + step:
            detail += f" (bounded by {self.low}-{self.high})"
        self._reply(cmd, ("acknowledged", cmd.name), ("done", detail))

    def finish(self) -> None:
        """The run returned: a ``shutdown`` / ``drain`` is done."""
        for cmd in self.stops:
            self._reply(cmd, ("done", "stopped"))
        self.stops.clear()

    def _reply(self, cmd: Command, *replies: tuple[str, str]) -> None:
        try:
            self.mq.commands.reply(cmd.id, *replies)
        except EchoMQError as err:
            log.warning("worker %s: could not reply to command %s (%s): %s",
                        self.worker_id, cmd.id, cmd.name, err)  # fmt: skip
