"""Settings for the example/test project that uses echomq_django.

Everything a developer may want to change comes from the environment:
ECHOMQ_URL (Redis), ECHOMQ_PREFIX (Redis key prefix, default "emq"), ECHOMQ_DB_PATH
(SQLite file), DJANGO_DEBUG, DJANGO_SECRET_KEY.
"""

import os
import socket
import sys
import tempfile
from importlib.util import find_spec
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

# Development-only default; set DJANGO_SECRET_KEY anywhere that matters.
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-echomq-testproject-dev-key-change-me"
)
DEBUG = os.environ.get("DJANGO_DEBUG", "1").lower() in ("1", "true", "yes", "on")
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "echomq_django",
    "testproject.orders",  # the orders pipeline demo (scripts/demo.sh)
    # The worker tests' handlers (t.*); tests/ is importable from the repo root.
    "tests.support.workerapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"
ASGI_APPLICATION = "testproject.asgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("ECHOMQ_DB_PATH", str(BASE_DIR / "db.sqlite3")),
        # The web server, worker and pump processes write at once (the orders
        # demo): WAL lets readers run beside the writer, a writer waits up to
        # `timeout` seconds for the lock, and IMMEDIATE takes it at BEGIN so
        # two transactions never deadlock upgrading a read lock.
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
        },
    }
}

# The test suite runs the commit outbox's tests on PostgreSQL too, as the
# database alias "pg", when a server answers at ECHOMQ_TEST_PG (host:port,
# default 127.0.0.1:5432, trust auth; "off" disables it). pytest-django
# creates its own database there (test_echomq_<pid>) and drops it after.
ECHOMQ_TEST_PG = None
if "pytest" in sys.modules:
    # a file database (not the suite's in-memory one) where two threads
    # contend for SQLite's write lock as two processes would, in its default
    # (deferred) transaction mode
    DATABASES["sqlite_file"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(tempfile.gettempdir(), f"echomq-outbox-{os.getpid()}.sqlite3"),
        "OPTIONS": {"timeout": 20},
        "TEST": {
            "NAME": os.path.join(tempfile.gettempdir(), f"test-echomq-outbox-{os.getpid()}.sqlite3")
        },
    }
if "pytest" in sys.modules and os.environ.get("ECHOMQ_TEST_PG", "") != "off":
    _pg_host, _, _pg_port = os.environ.get("ECHOMQ_TEST_PG", "127.0.0.1:5432").rpartition(":")
    try:
        socket.create_connection((_pg_host, int(_pg_port)), timeout=0.5).close()
    except OSError:
        pass
    else:
        ECHOMQ_TEST_PG = f"{_pg_host}:{_pg_port}"
        DATABASES["pg"] = {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": f"echomq_{os.getpid()}",
            "HOST": _pg_host,
            "PORT": _pg_port,
            "USER": os.environ.get("ECHOMQ_TEST_PG_USER", "postgres"),
            "TEST": {"NAME": f"test_echomq_{os.getpid()}"},
        }

# Redis. The 6379 fallback is for a developer running the project by hand.
# The test suite never relies on it: tests/conftest.py starts a private
# redis-server, exports its URL as ECHOMQ_URL and points this cache at it
# (settings are imported before that server exists, hence the override there).
ECHOMQ_URL = os.environ.get("ECHOMQ_URL", "redis://127.0.0.1:6379/0")

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": ECHOMQ_URL,
        "OPTIONS": {"CLIENT_CLASS": "django_redis.client.DefaultClient"},
    }
}

# echomq_django. The connection is the "default" cache above; the
# library also honours the ECHOMQ_URL environment variable, which when set
# overrides the connection.
# The demo's crash test (orders_demo --crash-after) shortens the leases so a
# killed worker's jobs come back in seconds.
_LEASE_MS = int(os.environ.get("ECHOMQ_DEMO_LEASE_MS", "30000"))
ECHOMQ = {
    "CACHE": "default",
    "PREFIX": os.environ.get("ECHOMQ_PREFIX", "emq"),
    "QUEUES": {
        "orders": {"MAX_ATTEMPTS": 3, "BACKOFF_MS": 200, "LEASE_MS": _LEASE_MS},
        # Small backoffs keep the demo quick: an out-of-stock line
        # spends its 2 attempts in ~0.1 s, a declined card its 4 in ~0.7 s.
        "validation": {"BACKOFF_MS": 100, "LEASE_MS": _LEASE_MS},
        "inventory": {"MAX_ATTEMPTS": 2, "BACKOFF_MS": 100, "LEASE_MS": _LEASE_MS},
        "payments": {"MAX_ATTEMPTS": 4, "BACKOFF_MS": 100, "LEASE_MS": _LEASE_MS},
    },
}

# Django's tasks framework (django.tasks on Django 6; the django-tasks backport
# on 5.2, which is an app of its own) runs @task functions on our workers.
if find_spec("django.tasks") is None and find_spec("django_tasks") is not None:
    INSTALLED_APPS.append("django_tasks")
TASKS = {
    "default": {
        "BACKEND": "echomq_django.tasks.EchoMQBackend",
        "QUEUES": ["default", "tasks-other"],
    }
}

AUTH_PASSWORD_VALIDATORS = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / ".run" / "static"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"echomq_django": {"handlers": ["console"], "level": "INFO"}},
}
