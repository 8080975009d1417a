"""Testing your handlers against a real Redis (docs/howto/testing.md).

Copy this into your project's ``conftest.py`` and tests: a private
``redis-server`` on a free port for the session (never the one on 6379),
the app pointed at it, each test starting from an empty Redis, and a burst
worker that runs what the test added and returns.
"""

import pytest
import redis

import echomq_django as emq
from echomq_django import conf
from echomq_django.testing.redis_server import start_server


@pytest.fixture(scope="session")
def redis_url():
    """A private redis-server for the session; stopped at the end."""
    server = start_server()
    yield server.url
    server.stop()


@pytest.fixture
def echomq(redis_url, settings, monkeypatch):
    """The app pointed at the private server, empty at the start of the test.

    ``settings`` is pytest-django's fixture: the override is undone after
    the test. ``conf.reset()`` makes the app rebuild its client from them.
    """
    monkeypatch.delenv("ECHOMQ_URL", raising=False)  # it would win over URL
    settings.ECHOMQ = {**settings.ECHOMQ, "URL": redis_url}
    settings.ECHOMQ.pop("CACHE", None)  # URL or CACHE, not both
    redis.Redis.from_url(redis_url).flushdb()
    conf.reset()
    yield
    conf.reset()


def run_burst(*queues):
    """Runs the jobs of ``queues`` until they are empty, in this process;
    returns how many it ran. ``register=False``: it does not list itself
    among the live workers."""
    return emq.Worker(list(queues), concurrency=1, register=False).run(burst=True)


def test_the_report_counts_every_word(echomq):
    from wordcount.flows import count_words

    count_words(7, ["one two", "three"])
    run_burst("counting")  # the children
    emq.Pump(["counting", "reports"]).sweep()  # their results reach the parent
    run_burst("reports")  # the parent
    job = emq.get_job("reports", "report-7")
    assert (job.state, job.result) == ("completed", {"documents": 2, "words": 3})
