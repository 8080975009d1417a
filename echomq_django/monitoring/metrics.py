"""Metrics in Prometheus' text format
(docs/explanation/house.md#monitoring), with ``prometheus_client``
(the ``metrics`` extra: ``pip install 'echomq-django[metrics]'``).

Two kinds, the way Prometheus expects them:

* **per process**, counted where the work happens (a worker started with
  ``--metrics-port``): ``echomq_jobs_completed_total``,
  ``echomq_jobs_failed_total`` (attempts that will be retried) and
  ``echomq_jobs_dead_total`` by ``queue`` and ``name``, and the histogram
  ``echomq_handler_duration_seconds`` by ``queue`` and ``name``, and the
  progress and log writes ``echomq_progress_writes_dropped_total`` by
  ``queue`` and ``reason`` and ``echomq_progress_writes_waited_total`` by
  ``queue``. A job name with no registered handler is counted as
  ``(unregistered)``, so a stray name cannot grow the label set;
* **per queue**, read from Redis at scrape time (``QueueCollector``):
  ``echomq_queue_jobs{queue,state}``,
  ``echomq_queue_oldest_pending_age_seconds``, ``echomq_queue_outbox_depth``,
  ``echomq_queue_deadletters``, ``echomq_queue_paused``,
  ``echomq_queue_signal_backlog``, ``echomq_queue_signal_deadletters``,
  ``echomq_processes_live{kind}``
  and ``echomq_redis_up`` (0 when Redis did not answer the scrape).

Served by ``metrics_view`` (``echomq_django.urls``: ``metrics/``), open to
staff users, or to a bearer token when ``ECHOMQ["METRICS"]`` says so, and
by ``serve(port)`` for ``runworker`` / ``runpump --metrics-port``.
"""

from __future__ import annotations

import hmac
import logging

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpResponse

from ..conf import config, get_mq
from ..core.exceptions import EchoMQError
from ..handlers import registered
from ..runners.heartbeat import known_queues
from .stats import collect as collect_stats

try:
    import prometheus_client
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # the optional extra is not installed
    prometheus_client = None

log = logging.getLogger("echomq_django.metrics")

MISSING = "prometheus_client is not installed: pip install 'echomq-django[metrics]'"
ACCESS_MODES = ("staff", "token")
METRICS_KEYS = {"ACCESS", "TOKEN"}
TOKEN_MIN_CHARS = 16
UNREGISTERED = "(unregistered)"
# handler seconds: 5 ms .. 10 min
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def installed() -> bool:
    """Whether prometheus_client can be imported."""
    return prometheus_client is not None


# -- settings ---------------------------------------------------------------------
def settings_problems(cfg: dict | None = None) -> list[tuple[str, str, str]]:
    """Problems with ``ECHOMQ["METRICS"]`` as ``(check id, message, hint)``
    (ids ``echomq_django.E040``-``E043``); settings only, no I/O."""
    cfg = config() if cfg is None else cfg
    if "METRICS" not in cfg:
        return []
    m = cfg["METRICS"]
    if not isinstance(m, dict) or set(m) - METRICS_KEYS:
        return [
            (
                "echomq_django.E040",
                f"ECHOMQ['METRICS'] must be a dict with keys {', '.join(sorted(METRICS_KEYS))}, "
                f"got {m!r}",
                "Example: {'ACCESS': 'token', 'TOKEN': os.environ['ECHOMQ_METRICS_TOKEN']}.",
            )
        ]
    out = []
    access = m.get("ACCESS", "staff")
    if access not in ACCESS_MODES:
        out.append(
            (
                "echomq_django.E041",
                f"ECHOMQ['METRICS']['ACCESS'] is {access!r}",
                "'staff' (logged-in staff users only) or 'token' (a bearer token, or staff).",
            )
        )
    token = m.get("TOKEN")
    if access == "token" and (not isinstance(token, str) or len(token) < TOKEN_MIN_CHARS):
        out.append(
            (
                "echomq_django.E042",
                "ECHOMQ['METRICS']['ACCESS'] is 'token' but TOKEN is not a string of at least "
                f"{TOKEN_MIN_CHARS} characters",
                "Set TOKEN to a long random secret (python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'), read from the environment.",
            )
        )
    if not installed():
        out.append(("echomq_django.E043", "ECHOMQ['METRICS'] is set but " + MISSING, MISSING))
    return out


# -- per process ------------------------------------------------------------------
class ProcessMetrics:
    """The counters and histogram of one process (see the module docstring),
    registered once in ``registry`` (prometheus_client's default one)."""

    def __init__(self, registry=None) -> None:
        registry = registry if registry is not None else prometheus_client.REGISTRY
        labels = ("queue", "name")

        def counter(name: str, doc: str):
            return prometheus_client.Counter(name, doc, labels, registry=registry)

        self.outcomes = {
            "completed": counter("echomq_jobs_completed", "Jobs this process completed"),
            "failed": counter("echomq_jobs_failed", "Failed attempts that will be retried"),
            "dead": counter("echomq_jobs_dead", "Jobs that died here (attempts spent)"),
        }
        self.duration = prometheus_client.Histogram(
            "echomq_handler_duration_seconds",
            "Seconds a handler ran, whatever its outcome",
            labels,
            buckets=BUCKETS,
            registry=registry,
        )
        self.writes_dropped_total = prometheus_client.Counter(
            "echomq_progress_writes_dropped",
            "Progress values and log lines dropped: reason lease (refused under a lost lease) "
            "or stopped (unsent when the worker stopped with Redis away)",
            ("queue", "reason"),
            registry=registry,
        )
        self.writes_waited_total = prometheus_client.Counter(
            "echomq_progress_writes_waited",
            "Progress and log writes whose handler waited for room (the worker's bound of "
            "unsent writes)",
            ("queue",),
            registry=registry,
        )
        self._names: set[str] = set()

    def writes_dropped(self, queue: str, reason: str, n: int) -> None:
        """Count ``n`` (int >= 0) progress values and log lines of ``queue``
        dropped for ``reason``: ``lease`` (the script refused them: the
        lease was lost, the job is no longer active, or it was removed) or
        ``stopped`` (unsent when the worker stopped with Redis away).
        docs/reference/metrics.md#progress-and-log-writes"""
        self.writes_dropped_total.labels(queue, reason).inc(n)

    def writes_waited(self, queue: str, n: int) -> None:
        """Count ``n`` (int >= 0) writes of ``queue`` whose handler waited
        for room: the worker held its bound of unsent writes (10,000). The
        bound holds a writer; it drops nothing.
        docs/reference/metrics.md#progress-and-log-writes"""
        self.writes_waited_total.labels(queue).inc(n)

    def label(self, name: str) -> str:
        """``name`` when a handler is registered under it, else ``(unregistered)``."""
        if name in self._names:
            return name
        self._names = set(registered())
        return name if name in self._names else UNREGISTERED

    def job_finished(self, queue: str, name: str, outcome: str, seconds: float | None) -> None:
        """Count one finished attempt: ``outcome`` is ``completed``, ``failed``
        or ``dead`` (anything else is not counted); ``seconds`` the handler's
        run time (None: not observed)."""
        name = self.label(name)
        counter = self.outcomes.get(outcome)
        if counter is not None:
            counter.labels(queue, name).inc()
        if seconds is not None:
            self.duration.labels(queue, name).observe(seconds)


_process_metrics: ProcessMetrics | None = None

# per-queue gauges besides the job counts: name, help, value from a stats entry
QUEUE_GAUGES = (
    (
        "echomq_queue_oldest_pending_age_seconds",
        "Seconds the oldest pending job has waited (0 when none waits)",
        lambda q: q["oldest_pending_age_s"] or 0,
    ),
    ("echomq_queue_outbox_depth", "Fan-in entries waiting for the pump", lambda q: q["outbox"]),
    (
        "echomq_queue_deadletters",
        "Outbox entries that could not be delivered",
        lambda q: q["deadletter"],
    ),
    ("echomq_queue_paused", "1 when the queue is paused", lambda q: 1 if q["paused"] else 0),
    (
        "echomq_queue_signal_backlog",
        "Durable signal events not dispatched yet",
        lambda q: q["signals"],
    ),
    (
        "echomq_queue_signal_deadletters",
        "Signal events given up on after their receivers kept raising",
        lambda q: q["signals_deadletter"],
    ),
)


def process_metrics() -> ProcessMetrics | None:
    """This process's ``ProcessMetrics`` (made on first use), or None when
    prometheus_client is not installed."""
    global _process_metrics
    if _process_metrics is None and installed():
        _process_metrics = ProcessMetrics()
    return _process_metrics


# -- per queue --------------------------------------------------------------------
class QueueCollector:
    """Reads every queue's numbers from Redis at scrape time (``stats.collect``).

    ``mq``: an ``EchoMQ`` (None: the one from settings, built at the first
    scrape); ``queues``: the queues to report (None: every known queue).
    A scrape while Redis is down reports ``echomq_redis_up 0`` and nothing
    else of the queues; it never raises.
    """

    def __init__(self, mq=None, queues=None) -> None:
        self.mq, self.queues = mq, list(queues) if queues else None

    def describe(self):
        return []  # nothing read from Redis when registered

    def collect(self):
        up = GaugeMetricFamily("echomq_redis_up", "1 when Redis answered this scrape")
        try:
            mq = self.mq or get_mq()
            doc = collect_stats(mq, self.queues or known_queues(mq))
        except EchoMQError as err:
            log.warning("metrics: could not read Redis: %s", err)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        jobs = GaugeMetricFamily(
            "echomq_queue_jobs", "Jobs in each state", labels=["queue", "state"]
        )
        gauges = [
            (GaugeMetricFamily(n, doc_, labels=["queue"]), get) for n, doc_, get in QUEUE_GAUGES
        ]
        grouped = GaugeMetricFamily(
            "echomq_group_jobs",
            "Jobs of each group pending or active (docs/explanation/protocol.md#groups)",
            labels=["queue", "group", "state"],
        )
        for name, q in doc["queues"].items():
            for state, n in q["counts"].items():
                jobs.add_metric([name, state], n)
            for group, g in q["groups"].items():
                grouped.add_metric([name, group, "pending"], g["pending"])
                grouped.add_metric([name, group, "active"], g["active"])
            for family, get in gauges:
                family.add_metric([name], get(q))
        live = GaugeMetricFamily(
            "echomq_processes_live", "Workers and pumps whose heartbeat is current", labels=["kind"]
        )
        for kind in ("worker", "pump"):
            live.add_metric([kind], sum(1 for p in doc["processes"] if p["kind"] == kind))
        yield jobs
        yield grouped
        yield from (family for family, _ in gauges)
        yield live


class _Both:
    """A collector of this process's default registry plus the queues."""

    def __init__(self, queues: QueueCollector) -> None:
        self.queues = queues

    def describe(self):
        return []

    def collect(self):
        yield from prometheus_client.REGISTRY.collect()
        yield from self.queues.collect()


def _registry(mq=None, queues=None):
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(_Both(QueueCollector(mq, queues)))
    return registry


def exposition(mq=None, queues=None) -> bytes:
    """The text a scrape returns: this process's metrics and the queues'."""
    return prometheus_client.generate_latest(_registry(mq, queues))


def serve(port: int, host: str = "127.0.0.1", mq=None, queues=None):
    """Serve ``exposition`` on ``http://host:port/`` (any path) from a daemon
    thread; returns the server (``shutdown()`` stops it). Raises
    ``ImproperlyConfigured`` without prometheus_client, ``OSError`` when the
    port is taken."""
    if not installed():
        raise ImproperlyConfigured(MISSING)
    process_metrics()
    server, _thread = prometheus_client.start_http_server(
        port, addr=host, registry=_registry(mq, queues)
    )
    return server


def add_arguments(parser) -> None:
    """``--metrics-port PORT`` and ``--metrics-host HOST`` for ``runworker``
    and ``runpump``."""
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve Prometheus metrics on this port, 1-65535 (needs the 'metrics' extra: "
        "prometheus_client)",
    )
    parser.add_argument(
        "--metrics-host",
        default=None,
        metavar="HOST",
        help="with --metrics-port: the address it listens on (default 127.0.0.1; 0.0.0.0 for all)",
    )


def check_arguments(opts: dict) -> None:
    """Raise ``ValueError`` (one line, naming the flag and the rule) for a
    ``--metrics-port`` that is not a port from 1 to 65535, or a
    ``--metrics-host`` without it; before any Redis I/O."""
    port = opts.get("metrics_port")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"--metrics-port must be a port from 1 to 65535, got {port}")
    if opts.get("metrics_host") is not None and port is None:
        raise ValueError("--metrics-host applies with --metrics-port only")


def serve_for_command(opts: dict, mq, queues) -> str | None:
    """Serve the metrics when ``opts`` (a command's options) ask for it;
    returns why it could not (a one-line reason), else None."""
    if opts.get("metrics_port") is None:
        return None
    host = opts.get("metrics_host") or "127.0.0.1"
    try:
        serve(opts["metrics_port"], host, mq, queues)
    except (OSError, ImproperlyConfigured) as err:
        return f"cannot serve metrics on {host}:{opts['metrics_port']}: {err}"
    return None


# -- the view ---------------------------------------------------------------------
def access_denied(request) -> str | None:
    """Why ``request`` may not read the metrics, or None when it may: an
    active staff user always may; with ``ACCESS: 'token'`` so may a request
    carrying ``Authorization: Bearer <TOKEN>``."""
    m = config().get("METRICS") or {}
    if m.get("ACCESS", "staff") == "token" and isinstance(m.get("TOKEN"), str):
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode(), m["TOKEN"].encode()
        ):
            return None
    user = getattr(request, "user", None)
    if user is not None and user.is_active and user.is_staff:
        return None
    if m.get("ACCESS") == "token":
        return "metrics: send 'Authorization: Bearer <token>' (ECHOMQ['METRICS']['TOKEN'])"
    return "metrics: log in as a staff user"


def metrics_view(request) -> HttpResponse:
    """GET ``metrics/``: the exposition text (200), 403 with the reason
    without access, 503 without prometheus_client."""
    denied = access_denied(request)
    if denied:
        return HttpResponse(denied + "\n", status=403, content_type="text/plain")
    if not installed():
        return HttpResponse(MISSING + "\n", status=503, content_type="text/plain")
    return HttpResponse(exposition(), content_type=prometheus_client.CONTENT_TYPE_LATEST)
