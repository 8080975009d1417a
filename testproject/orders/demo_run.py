"""The orders demo, end to end, as real processes (``manage.py orders_demo``).

``Demo(...).run()``:

1. migrates the SQLite database (``ECHOMQ_DB_PATH`` or ``db.sqlite3``);
2. uses the Redis at ``ECHOMQ_URL`` when that variable is set (with a key
   prefix of its own, ``<PREFIX>-demo-<8 hex>``, so earlier runs never collide),
   else starts a private ``redis-server`` on a free loopback port (never
   6379), without persistence;
3. starts ``runserver`` (web), ``runworker`` and ``runpump`` for the four
   queues, each in a session of its own with its output in ``<log dir>/<name>.log``;
4. posts the orders through HTTP, shows a progress bar while their flows
   resolve, reads every order back through ``GET /orders/<id>/`` and every
   job's attempts from Redis, and compares each order with ``rules.predict``;
   With ``crash_after`` = N, once N orders have finished it SIGKILLs
   ``runworker`` and ``runpump`` and starts them again (a crash test: the
   leases are 2 s long, so the killed worker's jobs come back soon; the
   signals the pump had not sent yet are sent by the new one,
   docs/explanation/signals.md); the retries are then not compared, since an attempt the kill cut
   short counts as one;
5. prints the summary; with ``keep`` waits for Ctrl-C; then stops every
   process it started (SIGTERM, SIGKILL after ``demo_procs.GRACE_S`` s), also on
   Ctrl-C, SIGTERM, SIGHUP and errors.

``run()`` returns the exit status: 0 when every order ended as predicted, 1
when one did not, a post was refused, the flows did not all finish within
the timeout, or a process failed (``DemoError``), 130 after Ctrl-C (except
the Ctrl-C that ends ``keep``, which leaves the status as it was).
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import redis
from django.conf import settings
from django.core.management import call_command

from echomq_django import EchoMQ
from echomq_django.core.jobs import to_text
from echomq_django.core.rows import STATE_FIELDS, row_state
from echomq_django.testing.redis_server import free_port

from . import demo_procs
from .demo_procs import BASE_DIR, START_TIMEOUT_S, DemoError, Processes, Progress
from .models import Order
from .rules import predict

QUEUES = ("orders", "validation", "inventory", "payments")
TERMINAL = {"completed", "dead"}
POSTERS = 8  # concurrent HTTP posts
POLL_S = 0.2  # s between progress reads


class Demo:
    """One run. ``bodies``: ``[(label, POST body)]``; ``keep``: leave the
    processes running after the summary until Ctrl-C; ``timeout`` (s): how
    long the flows may take once posted; ``log_dir``: where the children's
    logs go; ``concurrency``: the worker's handler threads; ``crash_after``:
    SIGKILL and restart the worker and the pump once this many orders have
    finished (0: never); ``out``: a text stream for everything the demo
    prints."""

    def __init__(
        self,
        bodies: list[tuple[str, dict]],
        *,
        keep: bool = False,
        timeout: float = 120.0,
        log_dir: Path,
        concurrency: int = 8,
        crash_after: int = 0,
        out=sys.stdout,
    ):
        self.bodies, self.keep, self.timeout = bodies, keep, timeout
        self.concurrency, self.out = concurrency, out
        self.crash_after, self.crashed = crash_after, False
        log_dir.mkdir(parents=True, exist_ok=True)
        self.procs = Processes(log_dir)

    def say(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def run(self) -> int:
        """The whole demo; returns the exit status (see the module docstring)."""
        # SIGINT too: a process started in the background by a non-interactive
        # shell inherits SIGINT ignored, and Python then keeps it ignored, so
        # the Ctrl-C that ends --keep would never arrive.
        sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        previous = {sig: signal.signal(sig, _interrupt) for sig in sigs}
        try:
            return self._run()
        except KeyboardInterrupt:
            self.say("\n== interrupted: stopping the processes")
            return 130
        except DemoError as err:
            self.say(f"\n== demo failed: {err}")
            return 1
        except redis.RedisError as err:
            self.say(f"\n== demo failed: Redis stopped answering: {err}")
            return 1
        finally:
            self.procs.stop([n for n in self.procs.procs if n != "redis"])
            self.procs.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _run(self) -> int:
        db = settings.DATABASES["default"]["NAME"]
        self.say(f"== migrating {db}")
        call_command("migrate", verbosity=0, interactive=False)
        url, prefix = self._redis()
        env = {**os.environ, "ECHOMQ_URL": url, "ECHOMQ_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
        if self.crash_after:
            env["ECHOMQ_DEMO_LEASE_MS"] = "2000"  # testproject/settings.py reads it
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        manage = [sys.executable, str(BASE_DIR / "manage.py")]
        self.say(
            f"== starting the web server ({base}), runworker and runpump for "
            f"{' '.join(QUEUES)}; logs in {self.procs.log_dir}"
        )
        self.procs.start("web", [*manage, "runserver", f"127.0.0.1:{port}", "--noreload"], env)
        self.procs.start(
            "worker",
            [
                *manage,
                "runworker",
                *QUEUES,
                "--concurrency",
                str(self.concurrency),
                "--shutdown-timeout",
                "5",
            ],
            env,
        )
        self.procs.start("pump", [*manage, "runpump", *QUEUES, "--interval", "0.1"], env)
        self.say(
            "   pids: " + ", ".join(f"{name} {proc.pid}" for name, proc in self.procs.procs.items())
        )
        self._wait_for_web(base)
        mq = EchoMQ(redis.Redis.from_url(url), prefix=prefix)

        self.say(f"== posting {len(self.bodies)} orders to {base}/orders/")
        started = time.monotonic()
        pks, problems = self._post(base)
        orders = list(Order.objects.filter(pk__in=pks).order_by("pk").prefetch_related("lines"))
        finished, wall = self._wait_for_flows(orders, mq, started)
        if len(finished) < len(orders):
            late = [o.pk for o in orders if o.pk not in finished]
            problems.append(
                f"{len(late)} flows not finished after {self.timeout:g} s: orders "
                f"{', '.join(map(str, late[:20]))}{' ...' if len(late) > 20 else ''}"
            )
        counts = self.check(base, orders, finished, mq, problems)
        self._summary(counts, len(orders), len(finished), wall, base, problems)
        if self.keep:
            try:  # before the message: a Ctrl-C right after it must end --keep cleanly
                self.say(
                    "== --keep: the web server, worker, pump and Redis keep running; "
                    "Ctrl-C stops them"
                )
                while True:
                    self.procs.check()
                    time.sleep(0.5)
            except KeyboardInterrupt:  # the way out of --keep: the status stands
                self.say("\n== stopping the processes")
        return 1 if problems else 0

    def _redis(self) -> tuple[str, str]:
        base_prefix = settings.ECHOMQ.get("PREFIX", "emq")
        url = os.environ.get("ECHOMQ_URL")
        if url:
            try:
                redis.Redis.from_url(url, socket_timeout=5).ping()
            except (redis.RedisError, ValueError) as err:
                raise DemoError(f"the Redis at ECHOMQ_URL={url} does not answer: {err}") from None
            prefix = f"{base_prefix[:18]}-demo-{secrets.token_hex(4)}"
            self.say(f"== using the Redis at ECHOMQ_URL={url}, key prefix {prefix}")
            return url, prefix
        url = demo_procs.start_redis(self.procs)
        self.say(f"== started a private redis-server at {url}")
        return url, base_prefix

    def _wait_for_web(self, base: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self.procs.check()
            try:
                if demo_procs.http_json("GET", f"{base}/orders/", timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise DemoError(
                    f"the web server did not answer within {START_TIMEOUT_S:.0f} s; "
                    f"the end of its log:\n{self.procs.tail('web')}"
                )
            time.sleep(0.1)

    def _post(self, base: str) -> tuple[list[int], list[str]]:
        def post(item):
            label, body = item
            try:
                return label, *demo_procs.http_json("POST", f"{base}/orders/", body)
            except OSError as err:
                return label, 0, {"errors": {"request": str(err)}}

        pks, problems = [], []
        with ThreadPoolExecutor(POSTERS) as pool:
            for label, status, reply in pool.map(post, self.bodies):
                if status == 201:
                    pks.append(reply["id"])
                else:
                    errors = "; ".join(f"{k}: {v}" for k, v in reply.get("errors", {}).items())
                    problems.append(f"{label} refused ({status}): {errors}")
        return pks, problems

    def _jobs(self, mq: EchoMQ, orders: list[Order]):
        """Per order pk, the state and attempts of each job of its flow."""
        pipe = mq.client.pipeline(transaction=False)
        shape = []
        for order in orders:
            ids = order.job_ids()
            shape.append((order.pk, len(ids)))
            for queue, job_id in ids:
                pipe.hmget(mq.keys.job(queue, job_id), "attempts", *STATE_FIELDS)
        replies, out, i = pipe.execute(), {}, 0
        for pk, n in shape:
            out[pk] = [(to_text(row_state(s)), int(a or 0)) for a, *s in replies[i : i + n]]
            i += n
        return out

    def _wait_for_flows(self, orders: list[Order], mq: EchoMQ, started: float):
        """Poll until every flow's jobs are completed or dead and its order
        is decided, or ``timeout``; returns ``(finished pks, wall seconds)``."""
        progress = Progress(self.out, len(orders))
        deadline = time.monotonic() + self.timeout
        pending = list(orders)
        finished: set[int] = set()
        tally = {"fulfilled": 0, "failed": 0}
        while True:
            if pending:
                states = dict(
                    Order.objects.filter(pk__in=[o.pk for o in pending]).values_list("pk", "status")
                )
                jobs = self._jobs(mq, pending)
                for order in pending:
                    status = states.get(order.pk)
                    if status in tally and all(s in TERMINAL for s, _ in jobs[order.pk]):
                        finished.add(order.pk)
                        tally[status] += 1
                pending = [o for o in pending if o.pk not in finished]
            elapsed = time.monotonic() - started
            done = not pending or time.monotonic() > deadline
            progress.show(len(finished), tally["fulfilled"], tally["failed"], elapsed, final=done)
            if done:
                return finished, elapsed
            if self.crash_after and not self.crashed and len(finished) >= self.crash_after:
                self.crashed = True
                self.say(
                    f"\n== crash: {len(finished)} orders finished; SIGKILL runworker and "
                    "runpump, then start them again"
                )
                self.procs.crash_and_restart(["worker", "pump"])
            self.procs.check()
            time.sleep(POLL_S)

    def check(
        self, base: str, orders: list[Order], finished: set[int], mq: EchoMQ, problems: list[str]
    ) -> dict:
        """Compare each finished order (read back through the API) with
        ``predict``; appends a line per mismatch; returns the summary counts
        as ``{name: [actual over the finished orders, predicted over all]}``."""
        counts = {
            k: [0, 0] for k in ("fulfilled", "failed", "with ignored failures", "retries taken")
        }
        wanted = {o.pk: predict(o) for o in orders}
        for want in wanted.values():
            self._count(counts, 1, want)
        done = [o for o in orders if o.pk in finished]
        with ThreadPoolExecutor(POSTERS) as pool:
            details = list(
                pool.map(lambda o: demo_procs.http_json("GET", f"{base}/orders/{o.pk}/"), done)
            )
        jobs = self._jobs(mq, done)
        for order, (status, body) in zip(done, details, strict=False):
            want = wanted[order.pk]
            root = (body.get("flow") or {}).get("state") or {}
            got = {
                "status": body.get("status"),
                "ignored": len((body.get("outcome") or {}).get("ignored", [])),
                "retries": sum(max(0, attempts - 1) for _, attempts in jobs[order.pk]),
            }
            want_root = "completed" if want["status"] == "fulfilled" else "dead"
            self._count(counts, 0, got)
            compared = (
                ("status", "ignored") if self.crash_after else ("status", "ignored", "retries")
            )
            wrong = any(got[k] != want[k] for k in compared)
            if status != 200 or wrong or root.get("state") != want_root:
                problems.append(
                    f"order {order.pk} ({order.card[-4:]}, "
                    f"{', '.join(map(str, order.lines.all()))}): predicted {want} "
                    f"with flow {want_root}, got {got} with flow "
                    f"{root.get('state')} (GET status {status})"
                )
        return counts

    @staticmethod
    def _count(counts: dict, column: int, outcome: dict) -> None:
        if outcome["status"] in counts:
            counts[outcome["status"]][column] += 1
        if outcome["status"] == "fulfilled" and outcome["ignored"]:
            counts["with ignored failures"][column] += 1
        counts["retries taken"][column] += outcome["retries"]

    def _summary(
        self, counts: dict, total: int, finished: int, wall: float, base: str, problems: list[str]
    ) -> None:
        python = Path(sys.executable)
        if python.is_relative_to(BASE_DIR):
            python = python.relative_to(BASE_DIR)
        db = os.environ.get("ECHOMQ_DB_PATH")
        superuser = (
            f"cd {BASE_DIR} && {'ECHOMQ_DB_PATH=' + db + ' ' if db else ''}"
            f"{python} manage.py createsuperuser"
        )
        admin = f"{base}/admin/" + (
            "" if self.keep else "  (add --keep to browse it while the demo's processes run)"
        )
        self.say(
            f"\n== summary: {total} orders"
            + ("" if finished == total else f", {finished} of them finished")
        )
        for name, (actual, predicted) in counts.items():
            self.say(f"  {name:<22}{actual:>6}  (predicted {predicted})")
        if self.crashed:
            self.say("  (a crash run: an attempt the SIGKILL cut short counts as a retry)")
        self.say(f"  {'wall time':<22}{wall:>8.1f} s")
        self.say(f"  {'flows per second':<22}{finished / max(wall, 1e-9):>8.1f}")
        self.say(f"  {'admin':<22}{admin}")
        self.say(f"  {'create a superuser':<22}{superuser}")
        if problems:
            self.say(f"== {len(problems)} problem(s):")
            for line in problems:
                self.say(f"  - {line}")
        else:
            self.say(f"== all {total} orders ended in their predicted state")


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)
