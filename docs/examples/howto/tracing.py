"""docs/howto/tracing.md: OpenTelemetry set up once per process, and a view
whose request span holds the flow it adds, every job of it, on two queues."""

from django.http import JsonResponse
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import echomq_django as emq


def setup_tracing(exporter, service: str = "shop") -> TracerProvider:
    """Once per process (web and worker alike), e.g. at the end of
    settings.py; ``exporter`` is where spans go (an OTLP exporter in
    production)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider


@emq.handler("shop.pack")
def pack(job):
    return job.payload["item"]


@emq.handler("shop.ship")
def ship(job):
    return {"order": job.payload["order"], "items": sorted(job.children_values().values())}


tracer = trace.get_tracer("shop.views")


def checkout(request, order: int):
    # With opentelemetry-instrumentation-django the request's span exists
    # already; without it, the view opens one.
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER):
        ref = emq.add_flow(
            emq.Flow(
                "shipping",
                "shop.ship",
                {"order": order},
                job_id=f"ship-{order}",
                children=[emq.Flow("packing", "shop.pack", {"item": i}) for i in ("book", "lamp")],
            ),
            on_commit=False,
        )
    return JsonResponse({"jobs": [str(node) for node in ref.nodes]})
