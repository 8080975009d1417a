"""Retention settings: system checks E020-E023 with hints, the defaults, and
per-job ``keep`` validation. Settings only."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from echomq_django.core import retention as lc

pytestmark = pytest.mark.usefixtures("no_env_url")  # the settings are the test's alone

URL = "redis://127.0.0.1:1/0"


def checks(keep: dict) -> list:
    with override_settings(ECHOMQ={"URL": URL, "QUEUES": {"orders": keep}}):
        return [m for m in run_checks(databases=[]) if m.id.startswith("echomq_django.")]


@pytest.mark.parametrize(
    "keep,expected",
    [
        ({"KEEP_COMPLETED": 0, "KEEP_DEAD": {"COUNT": 5, "AGE_S": 60}}, []),
        ({"KEEP_COMPLETED": {"AGE_S": 3600}}, []),
        ({"KEEP_COMPLETED": -1}, ["E020"]),
        ({"KEEP_DEAD": 1.5}, ["E020"]),
        ({"KEEP_DEAD": True}, ["E020"]),
        ({"KEEP_COMPLETED": {"COUNT": 5, "AGE": 60}}, ["E021"]),
        ({"KEEP_COMPLETED": {}}, ["E022"]),
        ({"KEEP_COMPLETED": {"AGES": 1}}, ["E021", "E022"]),
        ({"KEEP_DEAD": {"COUNT": -3}}, ["E023"]),
        ({"KEEP_DEAD": {"COUNT": 5, "AGE_S": "1d"}}, ["E023"]),
    ],
)
def test_each_bad_keep_has_a_stable_id(keep, expected) -> None:
    assert [m.id for m in checks(keep)] == [f"echomq_django.{e}" for e in expected]


def test_a_keep_message_names_queue_setting_and_rule() -> None:
    [msg] = checks({"KEEP_DEAD": {"COUNT": -3}})
    assert msg.msg == "queue 'orders': KEEP_DEAD COUNT must be a whole number >= 0, got -3"
    assert msg.hint == lc.KEEP_HINT


def test_retention_reads_settings_and_defaults() -> None:
    opts = {"KEEP_COMPLETED": 5, "KEEP_DEAD": {"AGE_S": 60}}
    assert lc.retention(opts) == (lc.Keep(5, None), lc.Keep(None, 60))
    assert lc.retention({}) == (lc.Keep(1000, 86400), lc.Keep(10000, 1209600))
    assert lc.Keep(None, 60).args() == [lc.UNBOUNDED, 60000]


def test_parse_keep_refuses_naming_the_rule() -> None:
    with pytest.raises(ValueError, match=r"KEEP_DEAD has unknown keys \['X'\]\. A count keeps"):
        lc.parse_keep({"COUNT": 1, "X": 2}, "KEEP_DEAD")


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", {"AGE_S": 1}])
def test_a_jobs_own_keep_is_whole_seconds(bad) -> None:
    with pytest.raises(ValueError, match="keep must be a whole number of seconds >= 0"):
        lc.job_keep(bad)
    assert lc.job_keep(None) == "" and lc.job_keep(0) == "0" and lc.job_keep(90) == "90000"
