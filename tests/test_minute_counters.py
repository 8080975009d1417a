"""Per-minute counters (docs/explanation/protocol.md#minute-counters), on
both rigs: the transition scripts count added, completed, failed and dead
jobs per queue and minute in a bounded ring; ``mq.probes.minute_counts``
reads them. Sums run over the last two minutes, so a test that crosses a
minute boundary still sees every count."""

from __future__ import annotations

import pytest

from echomq_django import Flow, JobState
from echomq_django.protocol.probes import MINUTES_KEPT
from tests.support.jobkit import command_calls


def totals(mq, queue: str) -> dict[str, int]:
    _, counts = mq.probes.minute_counts([queue], 2)
    out = {"added": 0, "completed": 0, "failed": 0, "dead": 0}
    for row in counts[queue]:
        for kind in out:
            out[kind] += row[kind]
    return out


def test_every_add_and_every_end_is_counted_once(mq):
    mq.enqueue("q", "t.echo", 1, job_id="a")
    mq.enqueue_many("q", [("t.echo", 2), ("t.echo", 3)])
    # a root with two same-queue leaves (no event of their own) and one elsewhere
    mq.add_flow(
        Flow(
            "q",
            "t.sum",
            job_id="p",
            children=[Flow("q", "t.echo", 4), Flow("q", "t.echo", 5), Flow("r", "t.echo", 6)],
        )
    )
    assert totals(mq, "q") == {"added": 6, "completed": 0, "failed": 0, "dead": 0}
    assert totals(mq, "r") == {"added": 1, "completed": 0, "failed": 0, "dead": 0}
    first, second, third = mq.claim("q", 3)
    mq.complete(first, 1)
    mq.fail(second, "boom")  # attempts left: retried, counted as failed
    mq.fail(third, "boom", dead=True)
    assert totals(mq, "q") == {"added": 6, "completed": 1, "failed": 1, "dead": 1}


def test_the_ring_reuses_a_slot_that_holds_an_old_minute(mq):
    mq.enqueue("q", "t.echo", 1)
    now, counts = mq.probes.minute_counts(["q"], 1)
    assert counts["q"] == [
        {"minute": now, "minutes": 1, "added": 1, "completed": 0, "failed": 0, "dead": 0}
    ]
    # pretend the slot still holds the same minute of yesterday, with counts
    ring, slot = mq.keys.queue("q").minutes, now % MINUTES_KEPT
    mq.client.hset(ring, mapping={f"m{slot}": now - MINUTES_KEPT, f"a{slot}": 500, f"d{slot}": 7})
    assert mq.probes.minute_counts(["q"], 1)[1]["q"][0]["added"] == 0  # stale: not this minute
    mq.enqueue("q", "t.echo", 2)
    now2, counts = mq.probes.minute_counts(["q"], 1)
    if now2 == now:  # (a new minute would have used the next slot)
        assert counts["q"][0] == {
            "minute": now,
            "minutes": 1,
            "added": 1,
            "completed": 0,
            "failed": 0,
            "dead": 0,
        }
        assert mq.client.hget(ring, f"d{slot}") is None
    assert len(mq.client.hkeys(ring)) <= 5 * MINUTES_KEPT


def test_unknown_minutes_read_as_zero_and_the_range_is_checked(mq):
    now, counts = mq.probes.minute_counts(["never-used"], 60)
    assert [row["minute"] for row in counts["never-used"]] == list(range(now - 59, now + 1))
    assert {row["added"] + row["completed"] + row["dead"] for row in counts["never-used"]} == {0}
    for bad in (0, MINUTES_KEPT + 1, 1.5):
        with pytest.raises(ValueError, match="the counters keep the last 1440 minutes"):
            mq.probes.minute_counts(["q"], bad)


def test_a_long_range_is_summed_into_rows_on_the_server(mq):
    """``per`` > 1: each ring is summed by lua/sum_minutes.lua into rows of
    ``per`` minutes; the sums equal the per-minute rows', a stale slot (a
    minute of yesterday) counts nothing, and the last row may be short."""
    ring = mq.keys.queue("q").minutes
    for _ in range(2):  # a minute that turns mid-way turns once: the second try holds
        mq.client.delete(ring)
        now, _ = mq.probes.minute_counts(["q"], 1)
        counted = {now - 1439: (1, 2, 3, 4), now - 700: (10, 0, 5, 0), now - 1: (0, 7, 0, 1)}
        for minute, (a, c, f, d) in counted.items():
            slot = minute % MINUTES_KEPT
            fields = {f"m{slot}": minute, f"a{slot}": a, f"c{slot}": c, f"f{slot}": f}
            mq.client.hset(ring, mapping={**fields, f"d{slot}": d})
        stale = (now - 5) % MINUTES_KEPT  # yesterday's minute in this slot: not summed
        mq.client.hset(ring, mapping={f"m{stale}": now - 5 - MINUTES_KEPT, f"a{stale}": 900})
        _, by_minute = mq.probes.minute_counts(["q"], MINUTES_KEPT)
        last, summed = mq.probes.minute_counts(["q"], MINUTES_KEPT, per=24)
        if last == now:
            break
    assert last == now
    rows = summed["q"]
    assert len(rows) == 60
    assert [r["minute"] for r in rows] == list(range(now - 1439, now + 1, 24))
    assert {r["minutes"] for r in rows} == {24}
    for kind in ("added", "completed", "failed", "dead"):
        assert sum(r[kind] for r in rows) == sum(r[kind] for r in by_minute["q"])
    assert rows[0] == {
        "minute": now - 1439,
        "minutes": 24,
        "added": 1,
        "completed": 2,
        "failed": 3,
        "dead": 4,
    }
    assert rows[-1]["completed"] == 7 and rows[-1]["dead"] == 1
    assert sum(r["added"] for r in rows) == 11
    _, short = mq.probes.minute_counts(["q"], 50, per=24)
    assert [r["minutes"] for r in short["q"]] == [24, 24, 2]


def test_a_bad_per_is_refused_before_any_read(mq):
    for bad in (0, MINUTES_KEPT + 1, 2.0, True):
        with pytest.raises(ValueError, match="a row sums a whole number of minutes"):
            mq.probes.minute_counts(["q"], 60, per=bad)


def test_a_batch_of_completions_counts_with_one_hincrby_and_clears_full_once(mq):
    """complete's batch sums its counts (lib/emit.lua minute_batch) and
    clears the full mark once per call (lib/claimable.lua left_active):
    five completions in one call are one HINCRBY and one DEL on the
    queue's slot, and the ring still says five."""
    mq.enqueue_many("q", [("t.echo", n) for n in range(5)])
    jobs = mq.claim("q", 5)
    before = totals(mq, "q")["completed"]
    hincrby, dels = command_calls(mq.client, "hincrby"), command_calls(mq.client, "del")
    replies = mq.complete_many([(job, 1) for job in jobs])
    assert [r.state for r in replies] == [JobState.COMPLETED] * 5
    assert command_calls(mq.client, "hincrby") - hincrby == 1
    assert command_calls(mq.client, "del") - dels == 1
    assert totals(mq, "q")["completed"] - before == 5
