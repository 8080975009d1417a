"""OpenTelemetry traces (docs/howto/tracing.md), on both rigs, with the SDK's
in-memory exporter: a view that adds a cross-queue flow makes one trace
(the request, the add, every node's attempt); attempts carry their outcome;
nothing is traced or written with tracing off; a failing exporter or
processor never stops a job and warns once."""

from __future__ import annotations

import logging
import sys

import pytest
from django.http import JsonResponse
from django.test import Client
from django.urls import path

from echomq_django import Flow, JobState, WaitForChildren, handler
from echomq_django.runners.pump import Pump
from echomq_django.tracing import spans
from tests.support.workerkit import burst

otel_trace = pytest.importorskip("opentelemetry.trace")
sdk_trace = pytest.importorskip("opentelemetry.sdk.trace")
sdk_export = pytest.importorskip("opentelemetry.sdk.trace.export")
in_memory = pytest.importorskip("opentelemetry.sdk.trace.export.in_memory_span_exporter")

VIEW_MQ = None  # the EchoMQ the view adds to (set by the test)


def order_flow() -> Flow:
    """Three levels on three queues: orders/o1 <- tax/t1 <- lines/l3, and
    orders/o1 <- lines/l1, lines/l2."""
    return Flow(
        "orders",
        "t.sum_children",
        job_id="o1",
        children=[
            Flow("lines", "t.echo", 1, job_id="l1"),
            Flow("lines", "t.echo", 2, job_id="l2"),
            Flow(
                "tax",
                "t.sum_children",
                job_id="t1",
                children=[Flow("lines", "t.echo", 4, job_id="l3")],
            ),
        ],
    )


def add_order(request):
    """A view; no Django instrumentation is installed, so it opens the
    request's server span itself."""
    tracer = otel_trace.get_tracer("tests.view")
    with tracer.start_as_current_span("GET /order", kind=otel_trace.SpanKind.SERVER):
        ref = VIEW_MQ.add_flow(order_flow())
    return JsonResponse({"nodes": [str(n) for n in ref.nodes]})


urlpatterns = [path("order", add_order)]


@pytest.fixture
def exporter(monkeypatch):
    """A configured tracer provider (for this test only) exporting to memory."""
    provider = sdk_trace.TracerProvider()
    memory = in_memory.InMemorySpanExporter()
    provider.add_span_processor(sdk_export.SimpleSpanProcessor(memory))
    monkeypatch.setattr(otel_trace, "_TRACER_PROVIDER", provider)
    spans._warnings.next_at = spans._sdk_filter.next_at = 0.0
    yield provider, memory
    provider.shutdown()


def by_name(finished, name):
    return [s for s in finished if s.name == name]


def run_flow(mq) -> None:
    """Leaves, the middle node, then the root; the pump carries results across."""
    queues = ["lines", "tax", "orders"]
    for queue in queues:
        assert burst(mq, [queue])[1] > 0
        Pump(queues, mq=mq, register=False).sweep()


@pytest.mark.urls(__name__)
def test_a_view_adding_a_cross_queue_flow_makes_one_trace(mq, exporter, monkeypatch):
    _, memory = exporter
    monkeypatch.setattr(sys.modules[__name__], "VIEW_MQ", mq)
    reply = Client().get("/order")
    assert reply.json()["nodes"] == ["orders/o1", "lines/l1", "lines/l2", "tax/t1", "lines/l3"]
    run_flow(mq)
    assert (mq.get_job("orders", "o1").state, mq.get_job("orders", "o1").result) == (
        JobState.COMPLETED,
        7,
    )
    finished = memory.get_finished_spans()
    (request,) = by_name(finished, "GET /order")
    (add,) = by_name(finished, "echomq add_flow")
    runs = [s for s in finished if s.name.startswith("echomq run ")]
    assert len(finished) == 2 + len(runs)
    assert {s.context.trace_id for s in finished} == {request.context.trace_id}
    assert request.parent is None
    assert add.parent.span_id == request.context.span_id
    assert add.kind == otel_trace.SpanKind.PRODUCER
    assert dict(add.attributes) == {
        "messaging.system": "echomq",
        "messaging.destination.name": "orders",
        "messaging.message.id": "o1",
        "echomq.flow.nodes": 5,
    }
    assert sorted(
        (
            s.attributes["messaging.destination.name"],
            s.attributes["messaging.message.id"],
            s.name,
            s.attributes["echomq.job.attempt"],
            s.attributes["echomq.job.outcome"],
            s.parent.span_id,
            s.kind,
        )
        for s in runs
    ) == [
        (
            q,
            i,
            f"echomq run {name}",
            1,
            "completed",
            add.context.span_id,
            otel_trace.SpanKind.CONSUMER,
        )
        for q, i, name in [
            ("lines", "l1", "t.echo"),
            ("lines", "l2", "t.echo"),
            ("lines", "l3", "t.echo"),
            ("orders", "o1", "t.sum_children"),
            ("tax", "t1", "t.sum_children"),
        ]
    ]
    # the parent ran last: after every child's attempt ended
    (root,) = [s for s in runs if s.attributes["messaging.message.id"] == "o1"]
    assert root.start_time >= max(s.end_time for s in runs if s is not root)


def test_an_enqueue_joins_the_current_span_and_attempts_record_their_outcome(mq, exporter):
    _, memory = exporter
    tracer = otel_trace.get_tracer("tests")
    with tracer.start_as_current_span("caller") as caller:
        mq.enqueue("q", "t.flaky", {"fail_times": 1}, job_id="f", backoff_ms=0)
        mq.enqueue("q", "t.unrecoverable", job_id="u")
    mq.enqueue("q", "t.echo", 1, job_id="alone")  # no current span: a trace of its own
    burst(mq, ["q"])
    burst(mq, ["q"])  # the retry of f, once its backoff of 0 ms is promoted
    assert mq.get_job("q", "f").state == JobState.COMPLETED
    finished = memory.get_finished_spans()
    adds = {s.attributes["messaging.message.id"]: s for s in by_name(finished, "echomq enqueue")}
    assert adds["f"].parent.span_id == adds["u"].parent.span_id == caller.context.span_id
    assert adds["alone"].parent is None
    runs = sorted(
        (s.attributes["messaging.message.id"], s.attributes["echomq.job.attempt"], s)
        for s in finished
        if s.name.startswith("echomq run ")
    )
    assert [
        (i, n, s.attributes["echomq.job.outcome"], s.status.status_code.name) for i, n, s in runs
    ] == [
        ("alone", 1, "completed", "UNSET"),
        ("f", 1, "retry", "ERROR"),
        ("f", 2, "completed", "UNSET"),
        ("u", 1, "dead", "ERROR"),
    ]
    for i, _, s in runs:
        assert s.parent.span_id == adds[i].context.span_id
        assert s.context.trace_id == adds[i].context.trace_id
    (event,) = runs[1][2].events
    assert (event.name, event.attributes["exception.message"]) == ("exception", "flaky attempt 1")
    assert runs[3][2].events[0].attributes["exception.type"].endswith("Unrecoverable")
    # the stored error starts at the handler, traced or not
    assert mq.get_job("q", "u").error.splitlines()[2].endswith(", in unrecoverable")


def test_a_bulk_add_is_one_span_and_every_job_joins_it(mq, exporter):
    _, memory = exporter
    ids = mq.enqueue_many("q", [("t.echo", i) for i in range(3)])
    burst(mq, ["q"])
    finished = memory.get_finished_spans()
    (add,) = by_name(finished, "echomq enqueue_many")
    assert (add.attributes["messaging.message.id"], add.attributes["echomq.flow.nodes"]) == (
        ids[0],
        3,
    )
    runs = by_name(finished, "echomq run t.echo")
    assert sorted(s.attributes["messaging.message.id"] for s in runs) == sorted(ids)
    assert {s.parent.span_id for s in runs} == {add.context.span_id}


def test_tracing_off_writes_no_trace_context(mq):
    """No tracer provider configured (the default): no span, no row field."""
    assert spans.tracer() is None
    mq.enqueue("q", "t.echo", 1, job_id="a")
    mq.add_flow(Flow("q", "t.sum_children", job_id="p", children=[Flow("r", "t.echo", 2)]))
    many = mq.enqueue_many("q", [("t.echo", 1)])
    for queue, job_id in [("q", "a"), ("q", "p"), ("q", many[0])]:
        row = mq.keys.queue(queue).job(job_id)
        assert mq.client.hget(row, "traceparent") is None
    (job,) = mq.claim("q")
    assert (job.id, job.traceparent) == ("a", None)


def test_the_trace_context_is_on_the_row_and_claimed(mq, exporter):
    _, memory = exporter
    mq.enqueue("q", "t.echo", 1, job_id="a", priority=3)
    (add,) = memory.get_finished_spans()
    ctx = add.context
    expected = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
    assert mq.get_job("q", "a").traceparent == expected
    (job,) = mq.claim("q")
    assert (job.id, job.traceparent) == ("a", expected)


class Raising(sdk_export.SpanExporter):
    """An exporter whose backend is down."""

    def export(self, batch):
        raise ConnectionError("collector unreachable")


class RaisingOnEnd(sdk_trace.SpanProcessor):
    """A span processor that raises when a span ends."""

    def on_end(self, span) -> None:
        raise RuntimeError("processor broke")


def test_a_failing_exporter_never_stops_a_job_and_warns_once(mq, exporter, caplog):
    provider, memory = exporter
    provider.add_span_processor(sdk_export.SimpleSpanProcessor(Raising()))
    provider.add_span_processor(RaisingOnEnd())
    caplog.set_level(logging.WARNING)
    for i in range(5):
        mq.enqueue("q", "t.echo", i, job_id=f"j{i}")
    assert burst(mq, ["q"])[1] == 5
    assert [mq.get_job("q", f"j{i}").state for i in range(5)] == [JobState.COMPLETED] * 5
    sdk = [r for r in caplog.records if r.name.startswith("opentelemetry")]
    ours = [r for r in caplog.records if r.name == "echomq_django.tracing"]
    assert [r.getMessage() for r in sdk] == ["Exception while exporting Span."]
    assert [r.getMessage() for r in ours] == [
        "tracing: a span call failed (RuntimeError: processor broke); jobs go on "
        "(one warning a minute at most)"
    ]
    assert len(memory.get_finished_spans()) == 10  # 5 adds, 5 attempts: the others still got them


def test_the_warnings_go_through_once_a_minute_not_once_ever(mq, exporter, caplog):
    """A failing exporter keeps failing: the next minute warns once more."""
    provider, _memory = exporter
    provider.add_span_processor(RaisingOnEnd())
    caplog.set_level(logging.WARNING)
    ours = lambda: [r for r in caplog.records if r.name == "echomq_django.tracing"]  # noqa: E731
    mq.enqueue("q", "t.echo", 1)
    mq.enqueue("q", "t.echo", 2)
    assert len(ours()) == 1
    spans._warnings.next_at -= spans.WARN_EVERY_S  # a minute on
    mq.enqueue("q", "t.echo", 3)
    mq.enqueue("q", "t.echo", 4)
    assert len(ours()) == 2
    assert burst(mq, ["q"])[1] == 4  # and the jobs still ran
    assert len(ours()) == 2


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
        "00-" + "x" * 32 + "-" + "1" * 16 + "-01",
    ],
)
def test_a_malformed_trace_context_starts_a_new_trace(value):
    assert spans.parent_context(value) is None


def test_a_trace_context_round_trips():
    value = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    span = otel_trace.get_current_span(spans.parent_context(value))
    assert spans.traceparent(span) == value


@handler("trace.steps")
def trace_steps(job):
    """A step job: moves to delayed, then adds a child and waits, then returns."""
    step = job.payload["step"]
    if step == 0:
        job.update_payload({"step": 1})
        job.move_to_delayed(0)
    if step == 1:
        job.update_payload({"step": 2})
        job.add_children([Flow("q", "t.echo", 5, job_id="kid")])
        raise WaitForChildren
    return sum(job.children_values().values())


def test_a_step_job_s_attempts_record_postponed_and_waiting_children(mq, exporter):
    _, memory = exporter
    mq.enqueue("q", "trace.steps", {"step": 0}, job_id="s")
    for _ in range(3):
        burst(mq, ["q"])
    assert mq.get_job("q", "s").result == 5
    outcomes = [
        s.attributes["echomq.job.outcome"]
        for s in sorted(memory.get_finished_spans(), key=lambda s: s.start_time)
        if s.name == "echomq run trace.steps"
    ]
    assert outcomes == ["postponed", "waiting_children", "completed"]


@pytest.mark.parametrize("pool", ["thread", "async"])
def test_an_attempt_with_no_handler_for_its_name_is_an_errored_span(mq, exporter, pool):
    """A job whose name no handler has (a deploy that lost one) never runs a
    handler, yet each attempt shows in the trace: status ERROR, the
    ``UnknownJobName`` exception event, and the outcome its attempts left."""
    _, memory = exporter
    mq.enqueue("q", "t.misspelt", job_id="m", max_attempts=2, backoff_ms=0)
    burst(mq, ["q"], pool=pool)
    burst(mq, ["q"], pool=pool)
    assert mq.get_job("q", "m").state == JobState.DEAD
    runs = sorted(
        by_name(memory.get_finished_spans(), "echomq run t.misspelt"),
        key=lambda s: s.attributes["echomq.job.attempt"],
    )
    assert [
        (s.attributes["echomq.job.attempt"], s.attributes["echomq.job.outcome"]) for s in runs
    ] == [(1, "retry"), (2, "dead")]
    for s in runs:
        assert s.status.status_code.name == "ERROR"
        assert s.status.description.startswith(
            "UnknownJobName: no handler is registered for job name 't.misspelt'"
        )
        (event,) = s.events
        assert (event.name, event.attributes["exception.type"]) == ("exception", "UnknownJobName")
