"""Entries of a queue's events stream that name a run of jobs
(docs/explanation/protocol.md#events): the first id whole, each later id
that starts with the first's 12 bytes stored as ``:`` and the rest
(``run_text`` in lua/lib/emit.lua), and every reader (``mq.events``, the
probes, the admin mirror) turning them back into whole ids, for entries
of this form and of the earlier one (every id whole) alike."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from echomq_django import Flow
from echomq_django.core.events import run_ids
from echomq_django.models import MirroredJob
from echomq_django.monitoring.mirror import mirror_queue

STEP_S = 0.1  # s a follow waits for its next event before it ends
HEAD = "abcdefghijkl"  # 12 bytes: the part of an id a run's later ids may share
QUEUES = itertools.count()  # a queue of its own per example


def _raw(mq, queue: str, kind: str) -> list[str]:
    """The stored ``id`` field of each ``kind`` entry on ``queue``'s stream."""
    return [
        f[b"id"].decode()
        for _, f in mq.client.xrange(mq.keys.queue(queue).events)
        if f[b"e"] == kind.encode()
    ]


def _followed(mq, queue: str, kind: str) -> list[str]:
    with mq.events(queue, since="0-0", kinds=[kind], block_s=STEP_S) as follow:
        return [e.job_id for e in follow]


def _probed(mq, queue: str, kind: str) -> list[str]:
    return [j for _, j, e in mq.probes.events_after(queue, "0", 1000) if e == kind]


def test_a_cross_queue_flows_added_run_stores_later_ids_after_the_shared_bytes(mq) -> None:
    ref = mq.add_flow(Flow("p", "root", {}, children=[Flow("c", "leaf", {}) for _ in range(3)]))
    ids = [job_id for _, job_id in ref.children]
    head = ref.parent_id[:12]
    assert ids == [head + "1", head + "2", head + "3"]  # generated: the prefix, a hex counter
    assert _raw(mq, "c", "added") == [f"{head}1 :2 :3"]
    assert _followed(mq, "c", "added") == ids
    assert _probed(mq, "c", "added") == ids


def test_user_ids_are_stored_whole_or_after_the_12_bytes_they_share(mq) -> None:
    kids = ["alpha", "beta", "order-2026-12-03-a", "gamma"]
    mq.add_flow(Flow("p", "root", {}, job_id="r", children=[
        Flow("c", "leaf", {}, job_id=k) for k in kids]))  # fmt: skip
    mq.add_flow(Flow("p", "root", {}, job_id="r2", children=[
        Flow("c", "leaf", {}, job_id=f"order-2026-12-03-{k}") for k in "bcd"]))  # fmt: skip
    short = ["order-2026-12", "order-2026-1", "order-2026-"]  # no rest: whole
    mq.add_flow(Flow("p", "root", {}, job_id="r3", children=[
        Flow("c", "leaf", {}, job_id=k) for k in short]))  # fmt: skip
    mq.add_flow(Flow("p", "root", {}, job_id="r4", children=[
        Flow("c", "leaf", {}, job_id=k) for k in ("order", "order-2026-12-x")]))  # fmt: skip
    assert _raw(mq, "c", "added") == [
        "alpha beta order-2026-12-03-a gamma",  # no prefix shared with the first: whole
        "order-2026-12-03-b :2-03-c :2-03-d",  # the 12 bytes "order-2026-1" shared
        "order-2026-12 order-2026-1 order-2026-",
        "order order-2026-12-x",  # the first is shorter than 12 bytes
    ]
    expected = [
        *kids,
        *(f"order-2026-12-03-{k}" for k in "bcd"),
        *short,
        "order",
        "order-2026-12-x",
    ]
    assert _followed(mq, "c", "added") == expected
    assert _probed(mq, "c", "added") == expected


def test_a_cut_never_splits_a_utf8_character(mq) -> None:
    # 12 bytes are six é: the rest starts a character; "a" + six é: the 12th
    # byte starts an é, the rest would start inside it, so the id stays whole
    kids = ["ééééééx1", "ééééééx2", "aéééééé1", "aéééééé2"]
    mq.add_flow(Flow("p", "root", {}, job_id="r", children=[
        Flow("c", "leaf", {}, job_id=k) for k in kids[:2]]))  # fmt: skip
    mq.add_flow(Flow("p", "root", {}, job_id="r2", children=[
        Flow("c", "leaf", {}, job_id=k) for k in kids[2:]]))  # fmt: skip
    assert _raw(mq, "c", "added") == ["ééééééx1 :x2", "aéééééé1 aéééééé2"]
    assert _followed(mq, "c", "added") == kids
    assert _probed(mq, "c", "added") == kids
    assert run_ids("ééééééx1 :x2 :x3") == ["ééééééx1", "ééééééx2", "ééééééx3"]


def test_ids_counting_up_in_hex_are_stored_as_one_range(mq) -> None:
    # three or more rests in a row counting up by one in hex (a flow's
    # generated ids) make one part ::<first>:<last>; two stay apart, and a
    # rest that is not canonical hex, or an id sharing nothing, is itself
    head = "abcdefghijkl"
    rests = ["1", "2", "3", "4", "x", "6", "7", "a", "b", "c", "0f", "10"]
    ids = [head + r for r in rests] + ["other-id"]
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": j} for j in ids])
    mq.claim("q", len(ids))
    assert _raw(mq, "q", "active") == [f"{head}1 ::2:4 :x :6 :7 ::a:c :0f :10 other-id"]
    assert _followed(mq, "q", "active") == _probed(mq, "q", "active") == ids
    assert run_ids(f"{head}ff ::100:102") == [head + r for r in ("ff", "100", "101", "102")]


@pytest.mark.parametrize("form", ["new", "old"])
def test_claims_removals_and_progress_read_whole_in_either_form(mq, form) -> None:
    ids = [f"order-2026-12-03-{k}" for k in "abc"]
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": j} for j in ids])
    jobs = mq.claim("q", 3)
    mq.progress.write_many([(job, [str(i)], []) for i, job in enumerate(jobs)])
    key = mq.keys.queue("q").events
    assert (
        _raw(mq, "q", "active")
        == _raw(mq, "q", "progress")
        == ["order-2026-12-03-a :2-03-b :2-03-c"]
    )
    if form == "old":  # as the earlier version wrote them: every id whole
        mq.client.delete(key)
        mq.client.xadd(key, {"e": "active", "id": " ".join(ids)})
        mq.client.xadd(key, {"e": "progress", "id": " ".join(ids), "ps": "[0,1,2]"})
        mq.client.xadd(key, {"e": "removed", "id": " ".join(ids)})
    else:
        mq.client.xadd(key, {"e": "removed", "id": "order-2026-12-03-a :2-03-b :2-03-c"})
    with mq.events("q", since="0-0", kinds=["active", "progress", "removed"], block_s=STEP_S) as f:
        got = [(e.kind, e.job_id, e.fields.get("p")) for e in f]
    assert got == [
        *(("active", j, None) for j in ids),
        *(("progress", j, str(i)) for i, j in enumerate(ids)),
        *(("removed", j, None) for j in ids),
    ]
    assert [(e, j) for _, j, e in mq.probes.events_after("q", "0", 100)][-9:] == [
        (kind, j) for kind in ("active", "progress", "removed") for j in ids
    ]


@pytest.mark.django_db
@pytest.mark.parametrize("form", ["new", "old"])
def test_the_mirror_reads_a_run_in_either_form(mq, form) -> None:
    ids = [f"order-2026-12-03-{k}" for k in "abc"]
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": j} for j in ids])
    jobs = mq.claim("q", 3)
    mirror_queue(mq, "q")  # a full pass: the jobs listed as active, no progress
    mq.progress.write_many([(job, [str(10 + i)], []) for i, job in enumerate(jobs)])
    key = mq.keys.queue("q").events
    ((xid, fields),) = mq.client.xrevrange(key, count=1)
    assert fields[b"id"] == b"order-2026-12-03-a :2-03-b :2-03-c"
    if form == "old":  # the same entry as the earlier version wrote it
        mq.client.xdel(key, xid)
        mq.client.xadd(key, {"e": "progress", "id": " ".join(ids), "ps": "[10,11,12]"})
    report = mirror_queue(mq, "q")
    assert (report["full"], report["events"]) == (False, 3)
    rows = dict(MirroredJob.objects.filter(queue="q").values_list("job_id", "progress"))
    assert rows == {
        "order-2026-12-03-a": "10",
        "order-2026-12-03-b": "11",
        "order-2026-12-03-c": "12",
    }


def _rule(ids: list[str]) -> str:
    """The ``id`` field of a run of ASCII ids, by the rule as written in the
    docs (docs/explanation/protocol.md#relative-ids-in-a-run)."""
    first = ids[0]
    if len(ids) == 1 or len(first) < 12:
        return " ".join(ids)
    parts, serials = [first], []  # serials: the range being read

    def close() -> None:
        if len(serials) >= 3:
            parts.append(f"::{serials[0]:x}:{serials[-1]:x}")
        else:
            parts.extend(f":{n:x}" for n in serials)
        serials.clear()

    for job_id in ids[1:]:
        rest = job_id[12:] if len(job_id) > 12 and job_id[:12] == first[:12] else None
        canonical = (
            rest is not None and len(rest) <= 12 and rest == f"{int(rest, 16):x}"
            if rest and all(c in "0123456789abcdefABCDEF" for c in rest)
            else False
        )
        n = int(rest, 16) if canonical else None
        if serials and n is not None and n == serials[-1] + 1:
            serials.append(n)
            continue
        close()
        if n is not None:
            serials.append(n)
        else:
            parts.append(f":{rest}" if rest is not None else job_id)
    close()
    return " ".join(parts)


# a stretch of ids: serials counting up from a start (a flow's generated ids
# make ranges), or one odd id: not canonical hex, past 12 digits, or whole
_COUNTING = st.tuples(st.sampled_from([0, 9, 0xE, 0xFF, 0xFFFFFFFFFFFD]), st.integers(1, 6)).map(
    lambda run: [HEAD + f"{n:x}" for n in range(run[0], run[0] + run[1])]
)
_ODD = st.sampled_from(["0f", "A", "1B", "x", "1000000000000", "zz"]).map(lambda r: [HEAD + r])
_WHOLE = st.sampled_from(["other", "abcdefghijk"]).map(lambda job_id: [job_id])
_IDS = st.lists(st.one_of(_COUNTING, _ODD, _WHOLE), min_size=1, max_size=8).map(
    lambda stretches: list(dict.fromkeys(i for stretch in stretches for i in stretch))
)
_BOUND = ("fffffffffffd", "fffffffffffe", "ffffffffffff", "1000000000000")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(_IDS)
@example([HEAD + "1", *(HEAD + r for r in _BOUND)])  # a range up to the 12-digit bound
def test_a_claims_run_is_written_by_the_rule_and_read_whole(mq, ids) -> None:
    # the claim's `active` entry: ranges, relative rests and whole ids as the
    # rule says (a range's next serial is checked first, one format a job),
    # the 12-digit bound included, and read back as the ids claimed
    queue = f"runs{next(QUEUES)}"
    mq.enqueue_many(queue, [{"name": "t.echo", "job_id": j} for j in ids])
    assert [job.id for job in mq.claim(queue, len(ids))] == ids
    (raw,) = _raw(mq, queue, "active")
    assert raw == _rule(ids)
    assert run_ids(raw) == ids
