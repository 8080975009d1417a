"""The ``JSON_ENCODER`` setting: payloads
and results with dates, ``Decimal`` and ``UUID`` through Django's encoder;
refused with ``PayloadError`` (nothing written) without it."""

from __future__ import annotations

import enum
import json
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.test import override_settings
from hypothesis import given, settings
from hypothesis import strategies as st

import echomq_django as emq
from echomq_django import EchoMQ, Flow, JobState, PayloadError, conf
from echomq_django.core.jobs import to_json
from tests.support.workerkit import burst

UID = uuid.UUID("12345678-1234-5678-1234-567812345678")
PAYLOAD = {
    "amount": Decimal("12.50"),
    "day": date(2026, 12, 1),
    "at": datetime(2026, 12, 1, 6, 30, tzinfo=UTC),
    "id": UID,
}
AS_JSON = {
    "amount": "12.50",
    "day": "2026-12-01",
    "at": "2026-12-01T06:30:00Z",
    "id": "12345678-1234-5678-1234-567812345678",
}


@pytest.fixture
def djmq(redis_client) -> EchoMQ:
    return EchoMQ(redis_client, prefix="emq", json_encoder=DjangoJSONEncoder)


def test_payloads_and_results_through_djangos_encoder(djmq):
    djmq.enqueue("q", "t.echo", PAYLOAD, job_id="j1")
    djmq.enqueue("q", "t.decimal_total", {"prices": ["1.10", "2.25"]}, job_id="j2")
    djmq.add_flow(Flow("q", "t.sum_children", {"day": date(2026, 1, 2)}, job_id="p", children=[]))
    assert djmq.get_job("q", "j1").payload == AS_JSON
    assert djmq.get_job("q", "p").payload == {"day": "2026-01-02"}
    _, processed = burst(djmq, ["q"])
    assert processed == 3
    assert djmq.get_job("q", "j1").result == AS_JSON
    done = djmq.get_job("q", "j2")
    assert (done.state, done.result) == (JobState.COMPLETED, {"total": "3.35"})


def test_without_it_such_values_are_refused_and_nothing_is_written(mq):
    with pytest.raises(PayloadError, match="not JSON-serialisable"):
        mq.enqueue("q", "t.echo", PAYLOAD, job_id="j1")
    mq.enqueue("q", "t.decimal_total", {"prices": ["1.10"]}, job_id="j2")
    _, processed = burst(mq, ["q"])
    job = mq.get_job("q", "j2")
    # dead at once, attempts left: a retry would run the handler again for nothing
    assert processed == 1 and (job.state, job.attempts) == (JobState.DEAD, 1)
    assert job.max_attempts > 1
    assert job.error.startswith("PayloadError: result is not JSON-serialisable")
    assert mq.client.exists("emq:{q}:job:j1") == 0


def test_the_setting_reaches_the_module_api(r, transactional_db):
    cfg = {
        "URL": "redis://unused/0",
        "JSON_ENCODER": "django.core.serializers.json.DjangoJSONEncoder",
    }
    conf.reset()
    try:
        with override_settings(ECHOMQ=cfg):
            job_id = emq.enqueue("q", "t.echo", PAYLOAD)
            with transaction.atomic():  # through the outbox: the row holds plain JSON
                later = emq.enqueue("q", "t.echo", {"n": Decimal("1.5")})
            assert emq.get_job("q", later).payload == {"n": "1.5"}
    finally:
        conf.reset()
    assert EchoMQ(r).get_job("q", job_id).payload == AS_JSON


# -- the encoder without the setting ------------------------------------------------


class Color(enum.IntEnum):
    RED = 1


class Name(str):
    pass


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=_JSON)
def test_values_are_written_as_the_json_module_writes_them(value):
    assert to_json(value) == json.dumps(value, separators=(",", ":"), allow_nan=False)


@pytest.mark.parametrize(
    "value, text",
    [
        (Color.RED, "1"),
        (Name("a"), '"a"'),
        ((1, "x"), '[1,"x"]'),
        (-0.0, "-0.0"),
        (2**70, str(2**70)),
    ],
)
def test_subclasses_tuples_and_edges_are_written_as_the_json_module_writes_them(value, text):
    assert to_json(value) == json.dumps(value, separators=(",", ":")) == text


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_float_json_cannot_hold_is_refused(value):
    with pytest.raises(ValueError, match="Out of range float values"):
        to_json(value)
