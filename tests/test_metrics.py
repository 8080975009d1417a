"""Prometheus metrics: the per-process counters, the per-queue collector, the
``metrics/`` view and its access rule, ``serve(port)``.
"""

from __future__ import annotations

import urllib.request

import prometheus_client
import pytest
from django.conf import settings
from django.test import override_settings

from echomq_django import conf
from echomq_django.checks import check_metrics_settings
from echomq_django.monitoring import metrics
from echomq_django.monitoring.metrics import ProcessMetrics, QueueCollector, settings_problems
from echomq_django.runners.heartbeat import Heartbeat
from tests.support.factories import StaffUserFactory, UserFactory
from tests.support.rigs import free_port
from tests.test_stats import busy

TOKEN = "s3cret-token-0123456789"


def scrape(collector) -> prometheus_client.CollectorRegistry:
    registry = prometheus_client.CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def test_process_metrics_count_outcomes_by_queue_and_name():
    registry = prometheus_client.CollectorRegistry()
    m = ProcessMetrics(registry)
    m.job_finished("orders", "t.echo", "completed", 0.02)
    m.job_finished("orders", "t.echo", "completed", 3.0)
    m.job_finished("orders", "t.echo", "failed", 0.5)
    m.job_finished("orders", "no.such.handler", "dead", None)
    m.job_finished("orders", "t.echo", "lost", None)  # not an outcome: nothing counted
    value = registry.get_sample_value
    assert value("echomq_jobs_completed_total", {"queue": "orders", "name": "t.echo"}) == 2
    assert value("echomq_jobs_failed_total", {"queue": "orders", "name": "t.echo"}) == 1
    assert value("echomq_jobs_dead_total", {"queue": "orders", "name": "(unregistered)"}) == 1
    labels = {"queue": "orders", "name": "t.echo"}
    assert value("echomq_handler_duration_seconds_count", labels) == 3
    assert value("echomq_handler_duration_seconds_sum", labels) == pytest.approx(3.52)
    assert value("echomq_handler_duration_seconds_bucket", {**labels, "le": "0.025"}) == 1
    assert value("echomq_handler_duration_seconds_bucket", {**labels, "le": "0.5"}) == 2


def test_the_queue_collector_reads_every_gauge_from_redis(tmq, clock):
    busy(tmq, clock)
    Heartbeat(tmq, "pump", ["orders"], interval_s=5).beat()
    registry = scrape(QueueCollector(tmq, ["orders"]))
    value = registry.get_sample_value
    expected = {
        "pending": 1,
        "active": 0,
        "delayed": 1,
        "completed": 1,
        "dead": 1,
        "awaiting_children": 0,
    }
    for state, n in expected.items():
        assert value("echomq_queue_jobs", {"queue": "orders", "state": state}) == n
    assert value("echomq_queue_oldest_pending_age_seconds", {"queue": "orders"}) == 5.0
    assert value("echomq_queue_outbox_depth", {"queue": "orders"}) == 0
    assert value("echomq_queue_deadletters", {"queue": "orders"}) == 0
    assert value("echomq_queue_signal_backlog", {"queue": "orders"}) == 0
    assert value("echomq_queue_signal_deadletters", {"queue": "orders"}) == 0
    assert value("echomq_queue_paused", {"queue": "orders"}) == 0
    assert value("echomq_processes_live", {"kind": "worker"}) == 1
    assert value("echomq_processes_live", {"kind": "pump"}) == 1
    assert value("echomq_redis_up") == 1


def test_the_collector_finds_every_known_queue(tmq):
    tmq.presence.register_queues(["audit"])
    registry = scrape(QueueCollector(tmq))
    queues = {
        s.labels["queue"]
        for fam in registry.collect()
        if fam.name == "echomq_queue_outbox_depth"
        for s in fam.samples
    }
    assert queues == {"audit", "inventory", "orders", "payments", "validation"}


def test_a_scrape_while_redis_is_down_says_so_and_does_not_raise():
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from echomq_django import EchoMQ

    down = EchoMQ(redis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0)))
    registry = scrape(QueueCollector(down, ["orders"]))
    assert registry.get_sample_value("echomq_redis_up") == 0
    assert registry.get_sample_value("echomq_queue_outbox_depth", {"queue": "orders"}) is None


# -- the view ---------------------------------------------------------------------
URL = "/echomq/metrics/"


@pytest.fixture
def emq(r):
    conf.reset()
    yield conf.get_mq()
    conf.reset()


def with_metrics(**m):
    return override_settings(ECHOMQ={**settings.ECHOMQ, "METRICS": m})


@pytest.mark.django_db
def test_the_view_is_for_staff_by_default(client, emq):
    emq.enqueue("orders", "t.echo", {}, job_id="a")
    response = client.get(URL)
    assert (response.status_code, response.content) == (403, b"metrics: log in as a staff user\n")
    client.force_login(UserFactory())
    assert client.get(URL).status_code == 403
    client.force_login(StaffUserFactory())
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"] == prometheus_client.CONTENT_TYPE_LATEST
    text = response.content.decode()
    assert 'echomq_queue_jobs{queue="orders",state="pending"} 1.0' in text
    assert "echomq_redis_up 1.0" in text


@pytest.mark.django_db
def test_a_bearer_token_opens_the_view_when_the_setting_says_so(client, emq):
    with with_metrics(ACCESS="token", TOKEN=TOKEN):
        assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 200
        denied = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}x")
        assert (denied.status_code, denied.content) == (
            403,
            b"metrics: send 'Authorization: Bearer <token>' (ECHOMQ['METRICS']['TOKEN'])\n",
        )
        assert client.get(URL).status_code == 403
        client.force_login(StaffUserFactory())
        assert client.get(URL).status_code == 200
    # without the setting, a token opens nothing
    client.logout()
    assert client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").status_code == 403


@pytest.mark.parametrize(
    "value, ids",
    [
        ({"ACCESS": "staff"}, []),
        ({"ACCESS": "token", "TOKEN": TOKEN}, []),
        ("staff", ["echomq_django.E040"]),
        ({"ACCESS": "staff", "PORT": 9}, ["echomq_django.E040"]),
        ({"ACCESS": "everyone"}, ["echomq_django.E041"]),
        ({"ACCESS": "token"}, ["echomq_django.E042"]),
        ({"ACCESS": "token", "TOKEN": "short"}, ["echomq_django.E042"]),
    ],
)
def test_bad_metrics_settings_are_explained(value, ids):
    with override_settings(ECHOMQ={**settings.ECHOMQ, "METRICS": value}):
        assert [e.id for e in check_metrics_settings()] == ids
        assert all(e.hint for e in check_metrics_settings())


def test_metrics_settings_without_the_library_are_explained(monkeypatch):
    monkeypatch.setattr(metrics, "prometheus_client", None)
    [problem] = settings_problems({"METRICS": {"ACCESS": "staff"}})
    assert problem[:2] == (
        "echomq_django.E043",
        "ECHOMQ['METRICS'] is set but prometheus_client is not installed: "
        "pip install 'echomq-django[metrics]'",
    )
    assert settings_problems({}) == []


def test_serve_answers_a_scrape_on_its_port(tmq, clock):
    busy(tmq, clock)
    port = free_port()
    server = metrics.serve(port, mq=tmq, queues=["orders"])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    assert 'echomq_queue_jobs{queue="orders",state="dead"} 1.0' in text
    assert "# TYPE echomq_handler_duration_seconds histogram" in text
