# mysite/settings.py: add to the end of the file
# (docs/tutorial/index.md#point-it-at-redis)
import os

INSTALLED_APPS += ["echomq_django", "wordcount"]  # noqa: F821 (defined above in settings.py)

ECHOMQ = {
    # the environment variable ECHOMQ_URL, when set, wins over URL
    "URL": os.environ.get("ECHOMQ_URL") or "redis://127.0.0.1:6379/0",  # unset or empty
    "QUEUES": {
        "counting": {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 500},
        "reports": {"MAX_ATTEMPTS": 1},
    },
}
