"""Logging (docs/howto/logging.md): the library's lines through your
``LOGGING``; ``runworker`` and ``runpump`` then add no handler of their own."""

# settings.py
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "echomq_django": {"handlers": ["console"], "level": "INFO"},
        # a line per job from the worker, whatever --verbosity
        "echomq_django.worker": {"level": "DEBUG"},
        # the outbox drainer's warnings only
        "echomq_django.commit_outbox": {"level": "WARNING"},
    },
}
