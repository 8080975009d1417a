"""docs/howto/progress-and-logs.md: an app's ``jobs.py`` (a handler that
reports its progress and writes log lines), ``views.py`` (a view that shows
both while the job runs) and ``tasks.py`` (a helper a Django task calls to do
the same through current_job()).

Importing this package registers the handler, as the worker's autodiscovery
of ``jobs.py`` does, and gives ``tests/test_docs_examples.py`` the rest."""

from .jobs import thumbnails
from .tasks import report_step
from .views import status

__all__ = ["report_step", "status", "thumbnails"]
