"""docs/howto/tracing.md: OpenTelemetry set up once per process
(``otel_setup.py``, the end of ``settings.py``), an app's ``jobs.py`` (the
handlers of a flow on two queues) and ``views.py`` (a view whose request span
holds the flow it adds, every job of it).

Importing this package registers the handlers, as the worker's autodiscovery
of ``jobs.py`` does, and gives ``tests/test_docs_examples.py`` the rest."""

from .jobs import pack, ship
from .otel_setup import setup_tracing
from .views import checkout, tracer

__all__ = ["checkout", "pack", "setup_tracing", "ship", "tracer"]
