"""The demo under a crash: its worker and pump SIGKILLed mid-run
and started again, every order still ends in its predicted state; a failed
order is marked by the ``flow_failed`` receiver, which the new pump's
dispatcher runs for the events the killed one had not sent."""

from __future__ import annotations

import pytest

from testproject.orders.demo_data import generate
from tests.e2e.test_demo import expected, run_demo, summary

pytestmark = pytest.mark.e2e


def test_every_order_ends_as_predicted_when_the_worker_and_pump_are_killed_mid_run(
    r, redis_server, tmp_path
):
    proc = run_demo(redis_server, tmp_path, "--orders", "40", "--crash-after", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== crash: " in proc.stdout
    got, want = summary(proc.stdout), expected(generate(40, seed=7))
    outcomes = ("fulfilled", "failed", "with ignored failures")
    assert {k: got[k] for k in outcomes} == {k: want[k] for k in outcomes}
    assert want["failed"][0] > 0  # the mix has failed orders: the receiver had work
    assert "== all 40 orders ended in their predicted state" in proc.stdout
