"""docs/howto/wait.md: an app's ``jobs.py`` (the handler the worker runs) and
``views.py`` (a view that adds a job and answers with its result, or with 202
and the job's id when it takes longer than the view may wait).

Importing this package registers the handler, as the worker's autodiscovery
of ``jobs.py`` does, and gives ``tests/test_docs_examples.py`` the views."""

from .jobs import price
from .views import aquote, quote

__all__ = ["aquote", "price", "quote"]
