from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor


def setup_tracing(exporter, service: str = "shop") -> TracerProvider:
    """Once per process (web and worker alike), e.g. at the end of
    settings.py; ``exporter`` is where spans go (an OTLP exporter in
    production)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return provider
