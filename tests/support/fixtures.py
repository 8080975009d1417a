"""The kits' fixtures, for every test module (``tests/conftest.py`` loads
this file through ``pytest_plugins``; a test module never imports a fixture):

- ``clock``: a ``workerkit.Clock`` (fake ms time) starting at ``T0``;
- ``tmq``: an ``EchoMQ`` on the test's rig (prefix ``emq``) whose time is
  ``clock``, one run per rig, like ``mq``;
- ``seen``: an ``eventkit.Seen`` recording every durable signal sent during
  the test;
- ``no_env_url``: no ``ECHOMQ_URL`` in the environment and a fresh
  ``conf`` (for settings tests that build their own ``ECHOMQ``).

A test module may define a fixture of the same name; its own wins there.
Each fixture imports echomq_django (and the kits that import it) in its
body: loading this file must not import the library.
"""

from __future__ import annotations

import pytest


def database_params(*, sqlite_file: bool = False) -> list:
    """The ``pytest.param``s of the database aliases a commit-outbox test runs
    on: in-memory SQLite, a SQLite file when ``sqlite_file``, and PostgreSQL
    (skipped, with the reason, when the settings have no ``pg``). Called by a
    test module at import, when Django's settings are set up."""
    from django.conf import settings

    params = [pytest.param("default", id="sqlite")]
    if sqlite_file:
        params.append(pytest.param("sqlite_file", id="sqlite-file"))
    no_pg = pytest.mark.skipif(
        "pg" not in settings.DATABASES,
        reason="no PostgreSQL at ECHOMQ_TEST_PG (default 127.0.0.1:5432)",
    )
    return [*params, pytest.param("pg", id="postgresql", marks=no_pg)]


@pytest.fixture
def clock():
    from tests.support.workerkit import Clock

    return Clock()


def fan_in_options(request) -> dict:
    """``EchoMQ`` keywords for the test: under the ``via_flow_outbox`` marker
    (the tests of the flow outbox's own path), a cross-queue completion takes
    the outbox on the single server too, as on a Cluster
    (docs/explanation/protocol.md#fan-in-on-one-server)."""
    if request.node.get_closest_marker("via_flow_outbox"):
        return {"cross_queue_scripts": False}
    return {}


@pytest.fixture
def tmq(redis_client, clock, request):
    """An ``EchoMQ`` on the test's rig whose time is ``clock`` (and, under the
    ``via_flow_outbox`` marker, ``fan_in_options``)."""
    from echomq_django import EchoMQ

    return EchoMQ(redis_client, prefix="emq", clock=clock, **fan_in_options(request))


@pytest.fixture
def seen():
    """A ``Seen`` open for the test."""
    from tests.support.eventkit import Seen

    rec = Seen()
    try:
        yield rec
    finally:
        rec.close()


@pytest.fixture
def no_env_url(monkeypatch):
    """No ``ECHOMQ_URL`` and a fresh ``conf``, before and after the test."""
    from echomq_django import conf

    monkeypatch.delenv("ECHOMQ_URL", raising=False)
    conf.reset()
    yield
    conf.reset()
