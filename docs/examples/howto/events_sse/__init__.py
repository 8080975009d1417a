"""docs/howto/events.md: an app's ``jobs.py`` (the handler the worker runs),
``views.py`` (plain Django views that stream a job's events to a browser as
server-sent events, ``text/event-stream``, until it finishes) and ``urls.py``.

Importing this package registers the handler, as the worker's autodiscovery
of ``jobs.py`` does; ``tests/test_docs_examples.py`` uses it as the
``ROOT_URLCONF`` (its ``urlpatterns``) and reads ``KEEPALIVE_S``."""

from .jobs import render
from .urls import urlpatterns
from .views import FINAL, KEEPALIVE_S, ajob_events, frame, job_events

__all__ = ["FINAL", "KEEPALIVE_S", "ajob_events", "frame", "job_events", "render", "urlpatterns"]
