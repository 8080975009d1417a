"""The spans echomq_django makes (docs/howto/tracing.md#what-is-traced).

Stands beside ``core/`` on the bottom layer, so ``protocol/`` (the adds) and
``runners/`` (the attempts) both reach it. It imports ``opentelemetry`` when
it is installed (the ``[otel]`` extra) and nothing else outside the
standard library and ``core/``.

Tracing is on when ``opentelemetry-api`` is importable and the process set a
tracer provider (``opentelemetry.trace.set_tracer_provider``, or
``OTEL_PYTHON_TRACER_PROVIDER``); otherwise every entry point here returns
after one check and nothing is written to a job row. Tracing never fails a
job or an add: an error inside OpenTelemetry (a processor or exporter that
raises) is logged as one warning a minute at most, and so are the SDK's own
export errors (``quiet_sdk_logs``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..core.exceptions import MoveToDelayed, RateLimited, Unrecoverable, WaitForChildren

try:  # the [otel] extra
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
    from opentelemetry.trace.status import Status, StatusCode
except ImportError:  # not installed: tracing is off
    _trace = None

log = logging.getLogger("echomq_django.tracing")

TRACER_NAME = "echomq_django"
WARN_EVERY_S = 60.0  # s: at most one warning per this long about tracing trouble
# The SDK's loggers that report a failed export, once per span or batch.
SDK_EXPORT_LOGGERS = ("opentelemetry.sdk.trace.export", "opentelemetry.sdk._shared_internal")

# Span attributes (docs/howto/tracing.md#what-is-traced): OpenTelemetry's
# messaging names where one fits, ours for the rest.
SYSTEM, QUEUE, JOB_ID = "messaging.system", "messaging.destination.name", "messaging.message.id"
JOB_NAME, ATTEMPT, OUTCOME, NODES = (
    "echomq.job.name",
    "echomq.job.attempt",
    "echomq.job.outcome",
    "echomq.flow.nodes",
)

_cached: tuple[Any, Any] = (None, None)  # (the provider last seen, its tracer or None)


class OncePerInterval(logging.Filter):
    """A logging filter that lets one record through per ``every_s``
    seconds (float) and drops the rest; thread-safe."""

    def __init__(self, every_s: float = WARN_EVERY_S) -> None:
        super().__init__()
        self.every_s, self.next_at, self.lock = every_s, 0.0, threading.Lock()

    def due(self) -> bool:
        """True at most once per ``every_s``: the caller may log now."""
        now = time.monotonic()
        with self.lock:
            if now < self.next_at:
                return False
            self.next_at = now + self.every_s
            return True

    def filter(self, record: logging.LogRecord) -> bool:
        return self.due()


_warnings = OncePerInterval()
_sdk_filter = OncePerInterval()


def quiet_sdk_logs() -> None:
    """Let the SDK's export loggers (``SDK_EXPORT_LOGGERS``) log one record
    a minute at most: an exporter that fails on every span would otherwise
    log once per job. Idempotent; called when tracing is first found on."""
    for name in SDK_EXPORT_LOGGERS:
        logger = logging.getLogger(name)
        if _sdk_filter not in logger.filters:
            logger.addFilter(_sdk_filter)


def _trouble(what: str, exc: BaseException) -> None:
    """An error inside OpenTelemetry: warn (one a minute at most), go on."""
    if _warnings.due():
        log.warning(
            "tracing: %s failed (%s: %s); jobs go on (one warning a minute at most)",
            *(what, type(exc).__name__, exc),
        )


def tracer():
    """The tracer to use, or None when tracing is off (OpenTelemetry not
    installed, or no tracer provider configured). Cheap: one call and an
    identity check once the provider has been seen."""
    global _cached
    if _trace is None:
        return None
    provider = _trace.get_tracer_provider()
    if provider is _cached[0]:
        return _cached[1]
    if isinstance(provider, _trace.ProxyTracerProvider | _trace.NoOpTracerProvider):
        found = None
    else:
        found = provider.get_tracer(TRACER_NAME)
        quiet_sdk_logs()
    _cached = (provider, found)
    return found


def traceparent(span) -> str:
    """``span``'s context as a W3C ``traceparent`` header value
    (``00-<32 hex trace id>-<16 hex span id>-<2 hex flags>``), or '' when
    it has no valid context."""
    ctx = span.get_span_context()
    if not ctx.is_valid:
        return ""
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def parent_context(value: str | None):
    """The OpenTelemetry context a ``traceparent`` value (str, or None /
    '' for none) names, or None (no parent: the span starts a trace). A
    malformed value is no parent, not an error: a row written by another
    tool must not stop its job."""
    if not value or len(value) != 55 or value[2] != "-":
        return None
    try:
        trace_id, span_id, flags = int(value[3:35], 16), int(value[36:52], 16), value[53:]
        ctx = SpanContext(trace_id, span_id, True, TraceFlags(int(flags, 16)))
    except ValueError:
        return None
    if not ctx.is_valid:
        return None
    return _trace.set_span_in_context(NonRecordingSpan(ctx))


@contextmanager
def adding(what: str, queue: str, job_id: str, nodes: int | None = None) -> Iterator[str]:
    """A producer span around an add in the caller, a child of the current
    span (a web request's, say). ``what`` names the call (``"enqueue"``,
    ``"add_flow"``); ``queue`` / ``job_id`` name the job (a flow's root);
    ``nodes``: how many jobs a flow holds. Yields the ``traceparent`` to
    store on the rows ('' when tracing is off). An exception from the body
    is recorded on the span and re-raised unchanged.
    docs/howto/tracing.md#what-is-traced."""
    found = tracer()
    if found is None:
        yield ""
        return
    span = token = None
    try:
        attributes = {SYSTEM: "echomq", QUEUE: queue, JOB_ID: job_id}
        if nodes is not None:
            attributes[NODES] = nodes
        span = found.start_span(f"echomq {what}", kind=SpanKind.PRODUCER, attributes=attributes)
        token = _context.attach(_trace.set_span_in_context(span))
        value = traceparent(span)
    except Exception as exc:
        _trouble("starting the add's span", exc)
        value = ""
    try:
        yield value
    except BaseException as exc:
        if span is not None:
            _failed(span, exc)
        raise
    finally:
        _end(span, token)


def attempt(func: Callable[[Any], Any], job) -> Any:
    """``func(job)`` (a handler and its ``Job``) inside a consumer span, a
    child of the span the job's ``traceparent`` names (its add); returns
    what ``func`` returns and re-raises what it raises, recorded on the
    span with the outcome: ``completed``, ``retry``, ``dead``,
    ``postponed`` or ``waiting_children``. Off: just ``func(job)``.
    docs/howto/tracing.md#what-is-traced."""
    begun = _begin_attempt(job)
    if begun is None:
        return func(job)
    with _attempt_outcome(job, *begun):
        return func(job)


async def attempt_async(func: Callable[[Any], Any], job) -> Any:
    """``await func(job)`` (a coroutine function and its ``Job``) as
    ``attempt`` runs a sync handler: inside a consumer span when traced
    (the async pool, docs/howto/async-handlers.md#the-async-pool). The
    span's context is attached in the job's task, whose context is its own."""
    begun = _begin_attempt(job)
    if begun is None:
        return await func(job)
    with _attempt_outcome(job, *begun):
        return await func(job)


def refused_attempt(job, error: str) -> None:
    """An attempt whose handler never ran (no handler is registered for its
    name): its consumer span, as ``attempt``'s, ended at once with status
    ``ERROR``, ``error`` (str) as its description and ``exception`` event
    (type ``UnknownJobName``) and the outcome ``retry`` or ``dead`` by its
    attempts left, so a deploy that lost a handler shows in the traces.
    Off: nothing. docs/howto/tracing.md#what-is-traced"""
    begun = _begin_attempt(job)
    if begun is None:
        return
    span, token = begun
    outcome = "dead" if job.attempts >= job.max_attempts else "retry"
    event = {"exception.type": "UnknownJobName", "exception.message": error}
    try:
        span.set_attribute(OUTCOME, outcome)
        span.add_event("exception", event)
        span.set_status(Status(StatusCode.ERROR, error))
    except Exception as err:
        _trouble("recording the error", err)
    _end(span, token)


def _begin_attempt(job):
    """The attempt's span, started and attached: ``(span, token)``; None
    when tracing is off or the span could not start (logged)."""
    found = tracer()
    if found is None:
        return None
    try:
        span = found.start_span(
            f"echomq run {job.name}",
            context=parent_context(job.traceparent),
            kind=SpanKind.CONSUMER,
            attributes={SYSTEM: "echomq", QUEUE: job.queue, JOB_ID: job.id,
                        JOB_NAME: job.name, ATTEMPT: job.attempts},
        )  # fmt: skip
        return span, _context.attach(_trace.set_span_in_context(span))
    except Exception as exc:
        _trouble("starting the attempt's span", exc)
        return None


@contextmanager
def _attempt_outcome(job, span, token) -> Iterator[None]:
    """Records the handler's outcome on ``span`` and ends it."""
    try:
        yield
    except BaseException as exc:
        _failed(span, exc, _outcome(job, exc))
        raise
    else:
        _guard(span.set_attribute, OUTCOME, "completed")
    finally:
        _end(span, token)


def _outcome(job, exc: BaseException) -> str:
    """What the failed attempt does to the job (docs/howto/tracing.md#what-is-traced)."""
    if isinstance(exc, RateLimited | MoveToDelayed):
        return "postponed"
    if isinstance(exc, WaitForChildren):  # docs/howto/step-jobs.md
        return "waiting_children"
    if isinstance(exc, Unrecoverable) or job.attempts >= job.max_attempts:
        return "dead"
    return "retry"


def _failed(span, exc: BaseException, outcome: str | None = None) -> None:
    try:
        if outcome is not None:
            span.set_attribute(OUTCOME, outcome)
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
    except Exception as err:
        _trouble("recording the error", err)


def _end(span, token) -> None:
    if token is not None:
        _guard(_context.detach, token)
    if span is not None:
        _guard(span.end)


def _guard(call, *args) -> None:
    try:
        call(*args)
    except Exception as exc:
        _trouble("a span call", exc)
