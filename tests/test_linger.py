"""A busy loop's wait for finished jobs' batch-mates (runners/wake.py ``Linger``,
docs/explanation/no-polling.md#lingering-for-batch-mates): when it waits, what
ends the wait, when it rests; and on a real worker, a quick job's batch-mate
that ends within the wait is reported in the same batch (one ``completed``
entry for both), where a slow job's is not, on both rigs."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from echomq_django import JobState, handler
from echomq_django.runners import wake
from echomq_django.runners.reporter import Finished
from echomq_django.runners.wake import Inbox, Linger
from tests.support.workerkit import burst
from tests.test_complete_batch import entries

QUICK, SLOW = Finished(None, ms=0.1), Finished(None, ms=5.0)  # LINGER_S is 1 ms


FIRST_ENDED = threading.Event()  # set as the first job's handler returns


@handler("linger.first")
def first(job):
    time.sleep(job.payload["s"])
    FIRST_ENDED.set()
    return job.id


@handler("linger.then")
def then(job):
    """Returns ``s`` seconds after the first job's handler returned."""
    assert FIRST_ENDED.wait(10)
    time.sleep(job.payload["s"])
    return job.id


def started(timeout: float = 10.0) -> tuple[Linger, Inbox]:
    linger, inbox = Linger(), Inbox()
    linger.begin(time.monotonic() + timeout)
    return linger, inbox


def test_a_quick_job_with_others_running_takes_a_batch_mate() -> None:
    linger, inbox = started()
    inbox.put(mate := Finished(None, ms=0.2))
    assert linger.more(inbox, [QUICK], 0, 3, 10) is mate
    assert inbox.empty()


@pytest.mark.parametrize(
    ("finished", "freed", "executing", "room", "why"),
    [
        ([SLOW], 0, 3, 10, "a job in hand ran LINGER_S or more"),
        ([QUICK, SLOW], 0, 3, 10, "one of them is slow"),
        ([QUICK], 0, 1, 10, "nothing else runs"),
        ([QUICK], 1, 2, 10, "nothing else runs (a freed slot in hand)"),
        ([QUICK] * 4, 1, 8, 10, "half the room is free"),
        ([], 2, 5, 10, "no finished job in hand"),
    ],
)
def test_no_wait(finished, freed, executing, room, why) -> None:
    linger, inbox = started()
    inbox.put("left for the loop")
    with pytest.raises(queue.Empty):
        linger.more(inbox, finished, freed, executing, room)
    assert inbox.get_nowait() == "left for the loop", why


def test_a_wait_that_gathered_nothing_rests_then_waits_again(monkeypatch) -> None:
    monkeypatch.setattr(wake, "LINGER_S", 0.02)
    monkeypatch.setattr(wake, "LINGER_REST_S", 0.2)
    linger, inbox = started()
    began = time.monotonic()
    with pytest.raises(queue.Empty):
        linger.more(inbox, [QUICK], 0, 3, 10)
    assert time.monotonic() - began >= 0.02
    linger.begin(time.monotonic() + 10.0)
    inbox.put("resting")
    with pytest.raises(queue.Empty):  # resting: the item is the loop's at once
        linger.more(inbox, [QUICK], 0, 3, 10)
    assert inbox.get_nowait() == "resting"
    time.sleep(0.25)
    linger.begin(time.monotonic() + 10.0)
    inbox.put("rested")
    assert linger.more(inbox, [QUICK], 0, 3, 10) == "rested"


@pytest.mark.parametrize(
    ("executing", "rests"),
    [
        (3, True),  # what still runs is slow: the wait ran out though one came
        (2, False),  # the two in hand are all that ran: the wait ended sooner
    ],
)
def test_after_a_batch_mate_came_only_a_wait_that_ran_out_rests(
    monkeypatch, executing, rests
) -> None:
    monkeypatch.setattr(wake, "LINGER_S", 0.02)
    monkeypatch.setattr(wake, "LINGER_REST_S", 60.0)
    linger, inbox = started()
    inbox.put(mate := Finished(None, ms=0.2))
    assert linger.more(inbox, [QUICK], 0, executing, 10) is mate
    with pytest.raises(queue.Empty):
        linger.more(inbox, [QUICK, mate], 0, executing, 10)
    linger.begin(time.monotonic() + 10.0)
    inbox.put("next")
    if rests:
        with pytest.raises(queue.Empty):
            linger.more(inbox, [QUICK], 0, 3, 10)
        assert inbox.get_nowait() == "next"
    else:
        assert linger.more(inbox, [QUICK], 0, 3, 10) == "next"


def test_a_wait_cut_by_the_next_timer_neither_waits_past_it_nor_rests(monkeypatch) -> None:
    monkeypatch.setattr(wake, "LINGER_S", 0.5)
    linger, inbox = started(timeout=0.02)
    began = time.monotonic()
    with pytest.raises(queue.Empty):
        linger.more(inbox, [QUICK], 0, 3, 10)
    assert time.monotonic() - began < 0.4
    linger.begin(time.monotonic() + 10.0)
    inbox.put("not resting")
    assert linger.more(inbox, [QUICK], 0, 3, 10) == "not resting"


def run_pair(mq, monkeypatch, linger_s: float, first_s: float, gap_s: float):
    """Two jobs claimed together by a worker of four handlers, the first
    running ``first_s``, the second ending ``gap_s`` after it, with
    ``LINGER_S`` at ``linger_s``: the queue's new ``completed`` entries (one
    per batch reported)."""
    monkeypatch.setattr(wake, "LINGER_S", linger_s)
    FIRST_ENDED.clear()
    mq.enqueue("q", "linger.first", {"s": first_s}, job_id="first")
    mq.enqueue("q", "linger.then", {"s": gap_s}, job_id="second")
    before = len(entries(mq))
    _, processed = burst(mq, ["q"], concurrency=4)  # one in hand is under half the room
    assert processed == 2
    assert [mq.get_job("q", i).state for i in ("first", "second")] == [JobState.COMPLETED] * 2
    return [e for e in entries(mq)[before:] if e[0] == "completed"]


def test_a_quick_jobs_batch_mate_is_reported_with_it(mq, monkeypatch) -> None:
    # the second ends 0.2 s after the first, within a wait of 0.5 s
    got = run_pair(mq, monkeypatch, 0.5, 0.0, 0.2)
    assert got == [("completed", ["first", "second"])]


def test_a_slow_jobs_batch_mate_is_not_waited_for(mq, monkeypatch) -> None:
    # the first ran 0.45 s, past a wait of 0.4 s: handed over alone, where a
    # wait would have gathered the second, 0.15 s later
    got = run_pair(mq, monkeypatch, 0.4, 0.45, 0.15)
    assert got == [("completed", ["first"]), ("completed", ["second"])]
