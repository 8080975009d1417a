"""The orders pipeline of testproject: the view's validation and
on-commit flow, the post_save path, predict(), the demo data, and the whole
pipeline run in-process by a burst Worker and Pump sweeps."""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from django.db import transaction
from django.test import override_settings

from echomq_django import JobNotFound, Pump, Worker, conf
from testproject.orders.demo_data import KINDS, SAMPLE_CSV, generate, parse_lines, read_csv
from testproject.orders.flows import start_flow
from testproject.orders.models import Order, OrderLine
from testproject.orders.receivers import failed_job, mark_order_failed
from testproject.orders.rules import predict
from testproject.orders.validation import clean_order

QUEUES = ["orders", "validation", "inventory", "payments"]
GOOD = {
    "customer": "Ada Lovelace",
    "email": "ada@example.com",
    "card": "4242 4242 4242 4242",
    "lines": [{"sku": "BOOK-1", "qty": 2}, {"sku": "MUG-2", "qty": 1, "optional": True}],
}


class Rollback(Exception):
    pass


@pytest.fixture
def mq(r, transactional_db):
    """The settings' EchoMQ on the private server (empty), committed DB rows."""
    conf.reset()
    yield conf.get_mq()
    conf.reset()


def post(client, body, raw=None):
    return client.post(
        "/orders/", raw if raw is not None else json.dumps(body), content_type="application/json"
    )


def state(mq, queue, job_id):
    try:
        return mq.get_job(queue, job_id).state.value
    except JobNotFound:
        return None


def settle(mq, pks, bound_s=60.0):
    """Run burst workers and pump sweeps until every job of the orders' flows
    is completed or dead (backoffs make delayed jobs due meanwhile)."""
    orders = list(Order.objects.filter(pk__in=pks))
    deadline = time.monotonic() + bound_s
    while True:
        Worker(QUEUES, concurrency=1, mq=mq, poll_interval=0.01).run(burst=True)
        Pump(QUEUES, mq=mq).sweep()
        states = [state(mq, q, i) for o in orders for q, i in o.job_ids()]
        if all(s in ("completed", "dead") for s in states):
            return
        assert time.monotonic() < deadline, f"flows did not settle: {states}"
        time.sleep(0.05)


# -- validation: 400s name the field and the rule, nothing is written ---------


@pytest.mark.parametrize(
    "body, errors",
    [
        ([1], {"body": "must be a JSON object"}),
        ({**GOOD, "customer": " "}, {"customer": "required: a non-empty string"}),
        ({**GOOD, "email": "ada"}, {"email": "must be a valid email address"}),
        ({**GOOD, "card": "4242"}, {"card": "required: 12-19 digits (spaces and dashes allowed)"}),
        ({**GOOD, "via": "fax"}, {"via": 'must be "view" or "signal"'}),
        (
            {**GOOD, "gift": True},
            {"gift": "unknown field; allowed: card, customer, email, lines, via"},
        ),
        (
            {**GOOD, "lines": []},
            {"lines": "required: a non-empty list of {sku, qty, optional} objects"},
        ),
        ({**GOOD, "lines": [{"sku": "A"}] * 21}, {"lines": "at most 20 lines"}),
        ({**GOOD, "lines": ["BOOK-1"]}, {"lines[0]": "must be an object {sku, qty, optional}"}),
        (
            {**GOOD, "lines": [{"sku": "BOOK 1", "qty": 0, "optional": "yes", "price": 3}]},
            {
                "lines[0].price": "unknown field; allowed: optional, qty, sku",
                "lines[0].sku": "required: 1-64 characters from A-Z a-z 0-9 _ . -",
                "lines[0].qty": "must be an integer from 1 to 99",
                "lines[0].optional": "must be true or false",
            },
        ),
        (
            {**GOOD, "lines": [{"sku": "A", "qty": True}]},
            {"lines[0].qty": "must be an integer from 1 to 99"},
        ),
    ],
)
def test_a_bad_body_is_a_400_naming_field_and_rule_and_writes_nothing(client, mq, r, body, errors):
    resp = post(client, body)
    assert resp.status_code == 400
    assert resp.json() == {"errors": errors}
    assert Order.objects.count() == 0
    assert r.keys("*") == []


def test_a_body_that_is_not_json_is_a_400(client, mq, r):
    resp = post(client, None, raw="{nope")
    assert resp.status_code == 400
    assert resp.json() == {
        "errors": {
            "body": "must be valid JSON (Expecting property name "
            "enclosed in double quotes: line 1 column 2 "
            "(char 1))"
        }
    }
    assert r.keys("*") == []


def test_clean_order_normalises_card_and_defaults():
    order, errors = clean_order(
        {**GOOD, "card": "4242-4242 4242-4242", "lines": [{"sku": "BOOK-1"}]}
    )
    assert errors == {}
    assert order == {
        "customer": "Ada Lovelace",
        "email": "ada@example.com",
        "card": "4242424242424242",
        "via": "view",
        "lines": [{"sku": "BOOK-1", "qty": 1, "optional": False}],
    }


# -- on commit: the flow lands with the order, or not at all ------------------


def test_post_saves_the_order_and_lands_its_flow_on_commit(client, mq):
    resp = post(client, GOOD)
    assert resp.status_code == 201
    pk = resp.json()["id"]
    body = resp.json()
    assert {k: body[k] for k in ("status", "via", "card_last4", "lines", "predicted", "flow")} == {
        "status": "pending",
        "via": "view",
        "card_last4": "4242",
        "lines": [
            {"number": 1, "sku": "BOOK-1", "qty": 2, "optional": False},
            {"number": 2, "sku": "MUG-2", "qty": 1, "optional": True},
        ],
        "predicted": {"status": "fulfilled", "ignored": 0, "retries": 0},
        "flow": {"queue": "orders", "job_id": f"order-{pk}", "jobs": 5},
    }
    assert {(q, i): state(mq, q, i) for q, i in Order.objects.get(pk=pk).job_ids()} == {
        ("orders", f"order-{pk}"): "awaiting_children",
        ("validation", f"validate-{pk}"): "awaiting_children",
        ("payments", f"charge-{pk}"): "pending",
        ("inventory", f"reserve-{pk}-1"): "pending",
        ("inventory", f"reserve-{pk}-2"): "pending",
    }
    reserve = mq.get_job("inventory", f"reserve-{pk}-2")
    assert (reserve.parent, reserve.parent_queue, reserve.parent_policy) == (
        f"validate-{pk}",
        "validation",
        "id",
    )
    assert mq.get_job("inventory", f"reserve-{pk}-1").parent_policy == "fp"
    assert mq.get_job("payments", f"charge-{pk}").payload == {
        "order": pk,
        "card": "4242424242424242",
        "amount_cents": 2 * 2231 + 827,
    }


def test_a_rolled_back_transaction_leaves_nothing_in_redis(mq, r):
    with pytest.raises(Rollback), transaction.atomic():
        viewed = Order.objects.create(customer="A", email="a@example.com", card="4" * 16)
        OrderLine.objects.create(order=viewed, number=1, sku="BOOK-1", qty=1)
        ref = start_flow(viewed)
        signalled = Order.objects.create(
            customer="B", email="b@example.com", card="4" * 16, via=Order.Via.SIGNAL
        )
        OrderLine.objects.create(order=signalled, number=1, sku="MUG-2", qty=1)
        raise Rollback
    assert ref.parent_id == f"order-{viewed.pk}"  # known before the commit
    assert Order.objects.count() == 0
    assert r.keys("*") == []


def test_post_save_receiver_adds_the_flow_when_the_transaction_commits(mq, r):
    with transaction.atomic():
        order = Order.objects.create(
            customer="B", email="b@example.com", card="4" * 16, via=Order.Via.SIGNAL
        )
        OrderLine.objects.create(order=order, number=1, sku="MUG-2", qty=3)
        assert r.keys("*") == []  # the lines are not even saved when post_save fires
    assert state(mq, "orders", f"order-{order.pk}") == "awaiting_children"
    assert mq.get_job("inventory", f"reserve-{order.pk}-1").payload == {
        "order": order.pk,
        "line": 1,
        "sku": "MUG-2",
        "qty": 3,
        "optional": False,
        "amount_cents": 3 * 827,
    }


def test_an_update_or_a_view_order_starts_nothing_from_post_save(mq, r):
    order = Order.objects.create(customer="C", email="c@example.com", card="4" * 16)
    order.via = Order.Via.SIGNAL
    order.save()
    assert r.keys("*") == []


# -- GET ----------------------------------------------------------------------


def test_get_shows_the_order_with_its_live_flow(client, mq):
    pk = post(client, {**GOOD, "lines": [{"sku": "TEE-3"}]}).json()["id"]
    flow = client.get(f"/orders/{pk}/").json()["flow"]
    assert flow["state"]["state"] == "awaiting_children"
    assert [(c["id"], c["state"], c["policy"]) for c in flow["state"]["children"]] == [
        (f"charge-{pk}", "pending", "fp"),
        (f"validate-{pk}", "awaiting_children", "fp"),
    ]
    assert [(c["id"], c["state"]) for c in flow["state"]["children"][1]["children"]] == [
        (f"reserve-{pk}-1", "pending")
    ]


def test_get_before_the_flow_landed_and_for_an_unknown_id(client, mq):
    order = Order.objects.create(customer="D", email="d@example.com", card="4" * 16)
    assert client.get(f"/orders/{order.pk}/").json()["flow"]["state"] is None
    resp = client.get("/orders/999999/")
    assert resp.status_code == 404
    assert resp.json() == {"errors": {"id": "no order 999999"}}


# -- the pipeline, in-process ---------------------------------------------------


def test_every_path_ends_as_predicted_with_its_outcome(client, mq):
    bodies = {
        "clean": {**GOOD, "lines": [{"sku": "BOOK-1", "qty": 2}, {"sku": "MUG-2"}]},
        "transient": {**GOOD, "card": "4242424242420002", "lines": [{"sku": "TEE-3"}]},
        "declined": {**GOOD, "card": "4242424242420000", "lines": [{"sku": "PEN-5"}]},
        "optional_oos": {
            **GOOD,
            "lines": [{"sku": "CAP-4"}, {"sku": "OOS-POSTER", "optional": True}],
        },
        "required_oos": {
            **GOOD,
            "via": "signal",
            "lines": [{"sku": "OOS-VINYL"}, {"sku": "BAG-6"}],
        },
    }
    pks = {kind: post(client, body).json()["id"] for kind, body in bodies.items()}
    settle(mq, list(pks.values()))
    orders = {kind: Order.objects.get(pk=pk) for kind, pk in pks.items()}
    for kind in ("declined", "required_oos"):  # failed by the durable flow_failed signal
        event_id = orders[kind].outcome.pop("event_id")
        assert re.fullmatch(r"orders:\d+-\d+", event_id), event_id
    got = {kind: (o.status, o.outcome) for kind, o in orders.items()}
    d, o, q = pks["declined"], pks["optional_oos"], pks["required_oos"]
    assert got == {
        "clean": (
            "fulfilled",
            {
                "charged_cents": 5289,
                "refunded_cents": 0,
                "reserved": [1, 2],
                "ignored": [],
                "card_last4": "4242",
            },
        ),
        "transient": (
            "fulfilled",
            {
                "charged_cents": 7735,
                "refunded_cents": 0,
                "reserved": [1],
                "ignored": [],
                "card_last4": "0002",
            },
        ),
        "declined": (
            "failed",
            {
                "reason": f"failed by child payments/charge-{d}: CardDeclined: card "
                f"ending 0000 was declined (order {d})",
                "failed_job": f"payments/charge-{d}",
            },
        ),
        "optional_oos": (
            "fulfilled",
            {
                "charged_cents": 2342 + 7247,
                "refunded_cents": 7247,
                "reserved": [1],
                "ignored": [
                    {
                        "line": 2,
                        "sku": "OOS-POSTER",
                        "error": f"OutOfStock: sku OOS-POSTER is out of stock (order {o}, line 2)",
                    }
                ],
                "card_last4": "4242",
            },
        ),
        "required_oos": (
            "failed",
            {
                "reason": f"failed by child validation/validate-{q}: failed by child "
                f"inventory/reserve-{q}-1: OutOfStock: sku OOS-VINYL is out "
                f"of stock (order {q}, line 1)",
                "failed_job": f"inventory/reserve-{q}-1",
            },
        ),
    }
    assert {(qn, i): state(mq, qn, i) for qn, i in orders["required_oos"].job_ids()} == {
        ("orders", f"order-{q}"): "dead",
        ("validation", f"validate-{q}"): "dead",
        ("payments", f"charge-{q}"): "completed",
        ("inventory", f"reserve-{q}-1"): "dead",
        ("inventory", f"reserve-{q}-2"): "completed",
    }
    retries = {
        kind: sum(max(0, mq.get_job(qn, i).attempts - 1) for qn, i in o.job_ids())
        for kind, o in orders.items()
    }
    assert retries == {
        "clean": 0,
        "transient": 2,
        "declined": 3,
        "optional_oos": 1,
        "required_oos": 1,
    }
    assert {kind: predict(o) for kind, o in orders.items()} == {
        kind: {"status": status, "ignored": ignored, "retries": retries[kind]}
        for kind, status, ignored in [
            ("clean", "fulfilled", 0),
            ("transient", "fulfilled", 0),
            ("declined", "failed", 0),
            ("optional_oos", "fulfilled", 1),
            ("required_oos", "failed", 0),
        ]
    }


# -- predict --------------------------------------------------------------------


def body(card, *lines):
    return {"card": card, "lines": [{"sku": s, "qty": 1, "optional": opt} for s, opt in lines]}


@pytest.mark.parametrize(
    "order, expected",
    [
        (
            body("4242424242424242", ("BOOK-1", False)),
            {"status": "fulfilled", "ignored": 0, "retries": 0},
        ),
        (
            body("4242424242420001", ("BOOK-1", False)),
            {"status": "fulfilled", "ignored": 0, "retries": 1},
        ),
        (
            body("4242424242420003", ("BOOK-1", False)),
            {"status": "fulfilled", "ignored": 0, "retries": 3},
        ),
        (
            body("4242424242420000", ("BOOK-1", False)),
            {"status": "failed", "ignored": 0, "retries": 3},
        ),
        (
            body("4242424242424242", ("OOS-A", True), ("OOS-B", True), ("BOOK-1", True)),
            {"status": "fulfilled", "ignored": 2, "retries": 2},
        ),
        (
            body("4242424242424242", ("OOS-A", False), ("OOS-B", True)),
            {"status": "failed", "ignored": 0, "retries": 2},
        ),
        (
            body("4242424242420002", ("OOS-A", False)),
            {"status": "failed", "ignored": 0, "retries": 3},
        ),
        (
            body("4242424242420000", ("OOS-A", True)),
            {"status": "failed", "ignored": 0, "retries": 4},
        ),
    ],
)
def test_predict_from_the_data_alone(order, expected):
    assert predict(order) == expected


def test_predict_follows_the_queues_max_attempts(settings):
    settings.ECHOMQ = {
        **settings.ECHOMQ,
        "QUEUES": {"payments": {"MAX_ATTEMPTS": 3}, "inventory": {}},
    }
    assert predict(body("4242424242420003", ("OOS-A", True))) == {
        "status": "failed",
        "ignored": 0,
        "retries": 2 + 2,
    }
    with override_settings(ECHOMQ={**settings.ECHOMQ, "QUEUES": {}}):
        assert predict(body("4242424242420002", ("BOOK-1", False))) == {
            "status": "fulfilled",
            "ignored": 0,
            "retries": 2,
        }


def test_the_flow_failed_receiver_applies_one_event_once(transactional_db, caplog):
    order = Order.objects.create(customer="Ada", email="ada@example.com", card="4242424242420000")
    kwargs = {
        "queue": "orders",
        "job_id": f"order-{order.pk}",
        "job_name": "orders.fulfil",
        "error": "failed by child payments/charge-9: CardDeclined: no",
        "event_id": "orders:1700000000000-0",
    }
    mark_order_failed(None, **kwargs)
    first = Order.objects.get(pk=order.pk)
    with caplog.at_level(logging.INFO, "orders.receivers"):
        mark_order_failed(None, **kwargs)  # the dispatcher sent it again (at least once)
    again = Order.objects.get(pk=order.pk)
    assert (again.status, again.outcome, again.updated) == (
        "failed",
        {
            "reason": "failed by child payments/charge-9: CardDeclined: no",
            "failed_job": "payments/charge-9",
            "event_id": "orders:1700000000000-0",
        },
        first.updated,
    )
    assert [r.getMessage() for r in caplog.records if r.name == "orders.receivers"] == [
        f"flow_failed orders:1700000000000-0 for order {order.pk} again: applied already"
    ]


def test_failed_job_reads_the_bottom_of_a_chain():
    assert (
        failed_job(
            "failed by child validation/validate-4: failed by child "
            "inventory/reserve-4-2: OutOfStock: sku X\nTraceback"
        )
        == "inventory/reserve-4-2"
    )
    assert failed_job("ValueError: boom") == ""


# -- demo data -------------------------------------------------------------------


def test_generated_orders_are_fixed_by_the_seed_and_start_with_every_kind():
    orders = generate(12, seed=7)
    assert orders == generate(12, seed=7)
    assert orders != generate(12, seed=8)
    assert [predict(o)["status"] for o in orders[: len(KINDS)]] == [
        "fulfilled",
        "fulfilled",
        "failed",
        "fulfilled",
        "failed",
    ]
    assert orders[0]["card"][-4:] not in ("0000", "0001", "0002", "0003")
    assert orders[1]["card"][-4:] in ("0001", "0002", "0003")
    assert orders[2]["card"][-4:] == "0000"
    assert [sum(ln["sku"].startswith("OOS-") for ln in o["lines"]) for o in orders[:5]] == [
        0,
        0,
        0,
        1,
        1,
    ]
    assert all(clean_order(o)[1] == {} for o in orders)


def test_parse_lines():
    assert parse_lines("BOOK-1*2; MUG-2 ;OOS-KITE*1?;;") == [
        {"sku": "BOOK-1", "qty": 2, "optional": False},
        {"sku": "MUG-2", "qty": 1, "optional": False},
        {"sku": "OOS-KITE", "qty": 1, "optional": True},
    ]
    assert parse_lines("PEN-5*two") == [{"sku": "PEN-5", "qty": "two", "optional": False}]


def test_the_sample_csv_is_valid_and_covers_every_path():
    rows = read_csv(SAMPLE_CSV)
    assert [n for n, _ in rows] == list(range(2, 22))
    assert all(clean_order(b)[1] == {} for _, b in rows)
    outcomes = [predict(b) for _, b in rows]
    assert sum(o["status"] == "fulfilled" for o in outcomes) == 15
    assert sum(o["status"] == "failed" for o in outcomes) == 5
    assert sum(o["ignored"] > 0 for o in outcomes) == 5
    assert sum(o["retries"] for o in outcomes) == 31
    assert sum(b["via"] == "signal" for _, b in rows) == 6


# -- the demo's check -------------------------------------------------------------


def test_the_demo_lists_an_order_that_ended_otherwise_than_predicted(
    client, mq, monkeypatch, tmp_path
):
    from testproject.orders import demo_procs, demo_run

    pks = [
        post(client, {**GOOD, "lines": [{"sku": sku}]}).json()["id"]
        for sku in ("BOOK-1", "OOS-KITE")
    ]
    settle(mq, pks)
    Order.objects.filter(pk=pks[0]).update(status="failed", outcome={"reason": "made up"})

    def http_json(method, url, body=None, timeout=30.0):
        resp = client.generic(method, url.removeprefix("http://demo"))
        return resp.status_code, resp.json()

    monkeypatch.setattr(demo_procs, "http_json", http_json)
    demo = demo_run.Demo([], log_dir=tmp_path, out=None)
    orders = list(Order.objects.filter(pk__in=pks).order_by("pk"))
    problems = []
    counts = demo.check("http://demo", orders, set(pks), mq, problems)
    assert counts == {
        "fulfilled": [0, 1],
        "failed": [2, 1],
        "with ignored failures": [0, 0],
        "retries taken": [1, 1],
    }
    assert problems == [
        (
            f"order {pks[0]} (4242, 1 x BOOK-1): predicted {{'status': 'fulfilled', 'ignored': 0, "
            f"'retries': 0}} with flow completed, got {{'status': 'failed', 'ignored': 0, "
            f"'retries': 0}} with flow completed (GET status 200)"
        )
    ]
