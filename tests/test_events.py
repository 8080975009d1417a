"""Following the queues' events (docs/howto/events.md,
docs/explanation/protocol.md#following-the-events): ``mq.events`` yields
each transition of a job in order, resumes from an id, filters kinds,
reads queues on several Cluster slots at once, and says when it fell behind
the cap, on both rigs."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
import redis
from django.core.management import CommandError, call_command

import echomq_django as emq
from echomq_django import EchoMQ, Event, Gap
from echomq_django.core.events import KINDS
from echomq_django.protocol.live.events import READ_COUNT

STEP_S = 0.3  # s a follow waits for its next event in these tests before it ends


def life(mq, queue: str, job_id: str, result=None) -> None:
    """Add, claim and complete one job."""
    mq.enqueue(queue, "t.echo", 1, job_id=job_id)
    (job,) = mq.claim(queue)
    mq.complete(job, result)


def test_a_jobs_life_in_order(mq) -> None:
    follow = mq.events("q", block_s=STEP_S).start()
    life(mq, "q", "j1", result=7)
    got = list(follow)
    assert [(e.queue, e.kind, e.job_id) for e in got] == [
        ("q", "added", "j1"),
        ("q", "active", "j1"),
        ("q", "completed", "j1"),
    ]
    assert all(isinstance(e, Event) for e in got)
    assert got[0].ref == emq.JobRef("q", "j1")
    ids = [e.id for e in got]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert all(e.at_ms == int(e.id.split("-")[0]) for e in got)
    assert follow.position == {"q": got[-1].id}


def test_a_follow_counts_from_its_start(mq) -> None:
    mq.enqueue("q", "t.echo", 1, job_id="before")
    follow = mq.events("q", block_s=STEP_S).start()
    mq.enqueue("q", "t.echo", 1, job_id="after")
    assert [e.job_id for e in follow] == ["after"]


def test_one_claim_of_three_is_one_entry_and_three_events(mq) -> None:
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": f"c{i}"} for i in range(3)])
    follow = mq.events("q", kinds=["active"], block_s=STEP_S).start()
    assert len(mq.claim("q", 3)) == 3
    got = list(follow)
    assert sorted(e.job_id for e in got) == ["c0", "c1", "c2"]
    (entry,) = {e.entry_id for e in got}
    assert [e.id for e in got] == [f"{entry}:0", f"{entry}:1", f"{entry}:2"]
    assert mq.client.xlen(mq.keys.queue("q").events) == 4  # three added, one active


def test_a_follow_resumed_inside_an_entry_yields_its_other_events_once(mq) -> None:
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": f"c{i}"} for i in range(3)])
    mq.claim("q", 3)  # one entry, three active events
    mq.enqueue("q", "t.echo", job_id="after")
    follow = mq.events("q", since="0", kinds=["active", "added"], block_s=STEP_S)
    seen = [next(follow) for _ in range(4)]  # three added, the first active
    assert [(e.kind, e.job_id) for e in seen][3] == ("active", "c0")
    follow.close()
    rest = [(e.kind, e.job_id) for e in mq.events("q", since=follow.position, block_s=STEP_S)]
    assert rest == [("active", "c1"), ("active", "c2"), ("added", "after")]
    after_second = mq.events("q", since=f"{seen[3].entry_id}:1", block_s=STEP_S)
    assert [(e.kind, e.job_id) for e in after_second] == [("active", "c2"), ("added", "after")]
    whole = mq.events("q", since=seen[3].entry_id, block_s=STEP_S)  # after the whole entry
    assert [(e.kind, e.job_id) for e in whole] == [("added", "after")]


def test_one_call_s_progress_values_are_one_entry_and_an_event_each(mq) -> None:
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": j} for j in ("a", "b", "c")])
    a, b, c = mq.claim("q", 3)
    follow = mq.events("q", kinds=["progress"], block_s=STEP_S).start()
    big = '{"stage":"upload, then [x]","done":3}'
    mq.progress.write_many([(a, ["5", big], []), (b, ["7.5"], ["line"]), (c, [], ["x"])])
    mq.progress.write_many([(c, ["9"], [])])  # alone: the single entry, unchanged
    entries = mq.client.xrange(mq.keys.queue("q").events, "-", "+")
    raw = [f for _, f in entries if f[b"e"] == b"progress"]
    assert raw == [
        {b"e": b"progress", b"id": b"a a b", b"ps": b"[5," + big.encode() + b",7.5]"},
        {b"e": b"progress", b"id": b"c", b"p": b"9"},
    ]
    got = list(follow)
    assert [(e.job_id, dict(e.fields)) for e in got] == [
        ("a", {"p": "5"}),
        ("a", {"p": big}),
        ("b", {"p": "7.5"}),
        ("c", {"p": "9"}),
    ]
    assert len({e.entry_id for e in got[:3]}) == 1  # one entry, three events
    assert [e.id.partition(":")[2] for e in got] == ["0", "1", "2", ""]  # each its own id
    assert json.loads(got[1].fields["p"]) == {"stage": "upload, then [x]", "done": 3}


def test_a_batched_progress_entry_holds_at_most_a_hundred_values(mq) -> None:
    mq.enqueue_many("q", [{"name": "t.echo", "job_id": f"j{i}"} for i in range(250)])
    jobs = mq.claim("q", 250)
    mq.progress.write_many([(job, [str(i % 101)], []) for i, job in enumerate(jobs)])
    entries = mq.client.xrange(mq.keys.queue("q").events, "-", "+")
    sizes = [len(f[b"id"].split()) for _, f in entries if f[b"e"] == b"progress"]
    assert sizes == [100, 100, 50]
    assert [mq.get_job("q", f"j{i}").progress for i in (0, 120, 249)] == [0, 19, 47]


def test_kinds_filter_and_failure_kinds(mq) -> None:
    follow = mq.events("q", kinds=["failed", "dead", "completed"], block_s=STEP_S).start()
    mq.enqueue("q", "t.echo", 1, job_id="f", max_attempts=2, backoff_ms=60_000)
    (job,) = mq.claim("q")
    mq.fail(job, "boom")
    mq.enqueue("q", "t.echo", 1, job_id="d", max_attempts=1)
    (job,) = mq.claim("q")
    mq.fail(job, "boom")
    assert [(e.kind, e.job_id) for e in follow] == [("failed", "f"), ("dead", "d")]


def test_resume_from_an_id_or_a_position(mq) -> None:
    start = mq.events("q", block_s=STEP_S).start()
    for i in range(4):
        mq.enqueue("q", "t.echo", i, job_id=f"r{i}")
    first = next(start), next(start)
    assert [e.job_id for e in first] == ["r0", "r1"]
    start.close()
    assert list(start) == []  # closed: nothing more
    by_id = mq.events("q", since=first[-1].id, block_s=STEP_S)
    assert [e.job_id for e in by_id] == ["r2", "r3"]
    by_position = mq.events("q", since={"q": first[0].id}, block_s=STEP_S)
    assert [e.job_id for e in by_position] == ["r1", "r2", "r3"]
    everything = mq.events("q", since="0", block_s=STEP_S)
    assert [e.job_id for e in everything] == ["r0", "r1", "r2", "r3"]


def test_many_readers_each_see_everything(mq) -> None:
    readers = [mq.events(["a", "b"], block_s=STEP_S).start() for _ in range(3)]
    life(mq, "a", "x")
    life(mq, "b", "y")
    for reader in readers:
        got = [(e.queue, e.kind, e.job_id) for e in reader]
        assert [g for g in got if g[0] == "a"] == [
            ("a", "added", "x"),
            ("a", "active", "x"),
            ("a", "completed", "x"),
        ]
        assert [g for g in got if g[0] == "b"] == [
            ("b", "added", "y"),
            ("b", "active", "y"),
            ("b", "completed", "y"),
        ]


def test_queues_on_several_slots_are_read_at_once(mq) -> None:
    queues = [f"s{i}" for i in range(6)]  # several slots on a Cluster: one thread each
    with mq.events(queues, block_s=1.0) as follow:
        follow.start()
        for q in queues:
            mq.enqueue(q, "t.echo", 1, job_id=f"{q}-j")
        got = []
        for event in follow:
            got.append((event.queue, event.job_id))
            if len(got) == len(queues):
                break
    assert sorted(got) == sorted((q, f"{q}-j") for q in queues)
    assert follow.position.keys() == set(queues)


def test_pause_and_resume_name_no_job(mq) -> None:
    follow = mq.events("q", kinds=["paused", "resumed"], block_s=STEP_S).start()
    mq.pause("q")
    mq.resume("q")
    got = list(follow)
    assert [(e.kind, e.job_id, e.ref) for e in got] == [
        ("paused", None, None),
        ("resumed", None, None),
    ]


def test_async_for(mq) -> None:
    async def follow() -> list:
        out = []
        async with mq.events("q", block_s=STEP_S) as events:
            await asyncio.to_thread(events.start)
            await asyncio.to_thread(life, mq, "q", "as")
            async for event in events:
                out.append((event.kind, event.job_id))
        return out

    assert asyncio.run(follow()) == [("added", "as"), ("active", "as"), ("completed", "as")]


def test_close_ends_a_step_blocked_in_another_thread(mq, monkeypatch) -> None:
    import threading

    from echomq_django.protocol.live import events as live_events

    monkeypatch.setattr(live_events, "SLICE_S", 0.3)  # one read blocks 0.3 s at most
    follow = mq.events("quiet")  # block_s None: until closed
    got = []
    reader = threading.Thread(target=lambda: got.extend(follow), daemon=True)
    reader.start()
    reader.join(0.5)
    assert reader.is_alive()  # blocked on a quiet queue
    follow.close()
    reader.join(5)
    assert not reader.is_alive() and got == []


def test_a_cancelled_async_step_ends_its_read_and_keeps_what_it_read(mq, monkeypatch) -> None:
    import threading

    from echomq_django.protocol.live import events as live_events

    monkeypatch.setattr(live_events, "SLICE_S", 0.3)

    async def run():
        follow = mq.events("q")
        await asyncio.to_thread(follow.start)
        step = asyncio.ensure_future(follow.__anext__())
        await asyncio.sleep(0.1)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        await asyncio.to_thread(life, mq, "q", "later")
        kinds = [(await follow.__anext__()).kind for _ in range(3)]
        follow.close()
        return kinds

    assert asyncio.run(run()) == ["added", "active", "completed"]
    names = [t.name for t in threading.enumerate()]
    assert names.count("echomq-events") <= 1  # the last read, ending within its slice


def fill(client, key: str, n: int) -> list[str]:
    """``n`` entries on ``key`` as the scripts write them (MAXLEN ~ 10,000)."""
    ids = []
    for start in range(0, n, 1000):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            pipe.xadd(key, {"e": "added", "id": f"g{i}"}, maxlen=10_000, approximate=True)
        ids.extend(x.decode() for x in pipe.execute())
    return ids


def test_a_follower_behind_the_cap_is_told(mq) -> None:
    r = mq.client
    key = mq.keys.queue("q").events
    ids = fill(r, key, 12_000)
    assert r.xlen(key) < 12_000  # trimmed: the earliest entries are gone
    follow = mq.events("q", since=ids[10], block_s=STEP_S)
    gap = next(follow)
    oldest = r.xrange(key, "-", "+", count=1)[0][0].decode()
    assert gap == Gap("q", ids[10], oldest)
    assert gap.kind == "gap" and gap.job_id is None
    after = next(follow)
    assert (after.kind, after.id) == ("added", oldest)
    assert follow.position == {"q": oldest}
    rest = sum(1 for _ in follow)
    assert rest == r.xlen(key) - 1  # the rest, no second gap


def test_no_gap_when_nothing_was_trimmed(mq) -> None:
    ids = fill(mq.client, mq.keys.queue("q").events, 3 * READ_COUNT)
    got = list(mq.events("q", since=ids[0], block_s=STEP_S))
    assert not any(isinstance(e, Gap) for e in got)
    assert [e.job_id for e in got] == [f"g{i}" for i in range(1, 3 * READ_COUNT)]


def test_the_stream_stays_capped(r) -> None:
    mq = EchoMQ(r, prefix="emq")
    jobs = [{"name": "t.echo", "job_id": f"b{i}"} for i in range(11_000)]
    for start in range(0, len(jobs), 1000):
        mq.enqueue_many("q", jobs[start : start + 1000])
    assert 10_000 <= r.xlen(mq.keys.queue("q").events) <= 10_100


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"queues": "bad name"}, ValueError, "invalid queue name 'bad name'"),
        ({"queues": []}, ValueError, "no queues to follow"),
        ({"queues": ["q"] * 65}, ValueError, "one follow reads at most 64"),
        ({"since": "yesterday"}, ValueError, "invalid since 'yesterday': a stream id is"),
        ({"since": "1-2-3"}, ValueError, "invalid since '1-2-3'"),
        ({"since": "1-2:x"}, ValueError, "or an event's id '<ms>-<seq>:<k>'"),
        ({"since": "1:2"}, ValueError, "invalid since '1:2'"),
        ({"since": 17}, ValueError, "invalid since 17"),
        ({"since": {"other": "1-0"}}, ValueError, "names queue 'other', which is not followed"),
        ({"kinds": ["added", "nope"]}, ValueError, r"unknown event kind\(s\) \['nope'\]"),
        ({"kinds": "added"}, TypeError, "kinds is a list of kind names"),
        ({"kinds": []}, ValueError, "kinds is empty"),
        ({"block_s": -1}, ValueError, "invalid block_s -1"),
        ({"block_s": float("nan")}, ValueError, "invalid block_s nan"),
        ({"since": "99999999999999999999-0"}, ValueError, "each an ASCII integer below 2\\*\\*64"),
        ({"since": "18446744073709551616-0"}, ValueError, "invalid since '18446744073709551616-0'"),
        ({"since": "\u0661-\u0660"}, ValueError, "invalid since"),
        ({"queues": None}, TypeError, "queues is one queue name or an iterable of names"),
    ],
)
def test_bad_input_is_refused_before_any_redis_io(kwargs, error, match) -> None:
    # a client on a closed port: any I/O would raise RedisUnavailable instead
    mq = EchoMQ(redis.Redis(port=1, socket_connect_timeout=0.2), prefix="emq")
    kwargs = {"queues": "q", **kwargs}
    with pytest.raises(error, match=match):
        mq.events(**kwargs)


def test_every_kind_the_scripts_write_is_known() -> None:
    import re
    from pathlib import Path

    lua = Path(__file__).resolve().parent.parent / "lua"
    written = set()
    for path in [*lua.glob("*.lua"), *lua.glob("lib/*.lua")]:
        written |= set(re.findall(r"emit(?:_to)?\([^,]+, '([a-z]+)'", path.read_text()))
    assert written <= KINDS
    assert {"added", "active", "completed", "failed", "dead", "released", "cancelled"} <= written
    assert "removed" in written


def test_module_api_follows_the_settings_connection(r) -> None:
    follow = emq.events("q", block_s=STEP_S).start()
    emq.enqueue("q", "t.echo", 1, job_id="m", on_commit=False)
    assert [(e.kind, e.job_id) for e in follow] == [("added", "m")]


def test_the_command_prints_events(r) -> None:
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("q", "t.echo", 1, job_id="c1")
    out = io.StringIO()
    call_command("echomq_events", "q", "--since", "0", "--block", "0.2", "--json", stdout=out)
    (line,) = out.getvalue().splitlines()
    row = json.loads(line)
    assert (row["queue"], row["kind"], row["job_id"]) == ("q", "added", "c1")
    out = io.StringIO()
    call_command("echomq_events", "q", "--since", "0", "--block", "0.2", stdout=out)
    assert out.getvalue().split()[1:4] == ["q", "added", "c1"]


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["q", "--since", "soon"], "invalid since 'soon'"),
        (["q", "--kinds", "added,nope"], r"unknown event kind\(s\) \['nope'\]"),
        (["bad name"], "invalid queue name"),
        (["q", "--block", "-2"], "invalid block_s -2.0"),
        (["q", "--count", "0"], "--count must be >= 1, got 0"),
    ],
)
def test_the_command_refuses_bad_flags(r, argv, match) -> None:
    with pytest.raises(CommandError, match=match):
        call_command("echomq_events", *argv, stdout=io.StringIO())


def test_a_follow_on_a_server_away_raises_redis_unavailable() -> None:
    mq = EchoMQ(redis.Redis(port=1, socket_connect_timeout=0.2), prefix="emq")
    follow = mq.events("q", block_s=0.1)
    with pytest.raises(emq.RedisUnavailable):
        next(follow)
