"""Job references and paged reads (docs/howto/read-flows.md#job-references), on both
rigs: the public API names jobs by ``JobRef`` and never shows a Redis key;
a ``JobRef`` is refused with the same errors as ``(queue, id)`` arguments;
the old raw-key forms still work for a release with a ``DeprecationWarning``;
a parent's children read page by page come back each exactly once."""

from __future__ import annotations

import dataclasses
import datetime
import enum
import pickle
import re
from types import SimpleNamespace

import pytest
from redis.cluster import RedisCluster

from echomq_django import Dispatcher, Flow, JobRef, Page, PayloadError, Pump, Worker
from echomq_django.admin.pages import CHILDREN_PER_PAGE, job_page
from echomq_django.core.keyspace import ID_RULE, QUEUE_RULE
from tests.support.jobkit import complete, kill, leaf, node, snapshot
from tests.support.workerkit import Recorder

QUEUES = ("orders", "validation", "inventory", "payments")


def strings(value):
    """Every string inside ``value``: dict keys and values, sequences,
    dataclass fields (not the private ones), a ``Job``'s refs."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list | tuple | set | frozenset):
        for v in value:
            yield from strings(v)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            if not f.name.startswith("_"):
                yield from strings(getattr(value, f.name))
        for name in ("ref", "parent_ref"):
            if isinstance(getattr(type(value), name, None), property):
                yield from strings(getattr(value, name))
    elif value is None or isinstance(value, bool | int | float | enum.Enum | datetime.datetime):
        return
    else:
        raise AssertionError(f"a public result of an unexpected type: {value!r}")


# -- JobRef, the value ---------------------------------------------------------


def test_a_job_ref_is_a_frozen_ordered_hashable_pair_written_queue_slash_id():
    ref = JobRef("payments", "c-o42")
    assert (ref.queue, ref.id, str(ref), repr(ref)) == (
        "payments",
        "c-o42",
        "payments/c-o42",
        "JobRef('payments', 'c-o42')",
    )
    assert ref == ("payments", "c-o42") and hash(ref) == hash(("payments", "c-o42"))
    queue, job_id = ref
    assert (queue, job_id) == ("payments", "c-o42")
    assert JobRef.parse("payments/c-o42") == ref
    assert JobRef.parse("q/a/b") == JobRef("q", "a/b")  # an id may hold '/'
    assert str(JobRef("q", "a/b")) == "q/a/b"
    assert sorted([JobRef("b", "a"), JobRef("a", "z"), JobRef("a", "b")]) == [
        JobRef("a", "b"),
        JobRef("a", "z"),
        JobRef("b", "a"),
    ]
    with pytest.raises(AttributeError):
        ref.queue = "other"
    assert pickle.loads(pickle.dumps(ref)) == ref
    assert type(pickle.loads(pickle.dumps(ref))) is JobRef


def test_a_bad_job_ref_is_refused_with_the_argument_errors(mq):
    cases = [
        (("bad queue!", "x"), f"invalid queue name 'bad queue!': {QUEUE_RULE}"),
        (("q", "a:b"), f"invalid job id 'a:b': {ID_RULE}"),
        (
            ("q", "a\x1bb"),
            f"invalid job id 'a\\x1bb': it holds U+001B (a control character); {ID_RULE}",
        ),
    ]
    for (queue, job_id), message in cases:
        with pytest.raises(ValueError) as refused:
            JobRef(queue, job_id)
        assert str(refused.value) == message
        with pytest.raises(ValueError) as argument:  # the same words as an argument
            mq.enqueue(queue, "n", job_id=job_id)
        assert str(argument.value) == message
    with pytest.raises(ValueError) as refused:
        JobRef.parse("no-slash")
    assert str(refused.value) == (
        f"invalid job ref 'no-slash': write 'queue/id' ({QUEUE_RULE}; {ID_RULE})"
    )


def test_remove_child_dependency_refuses_a_bad_ref_before_any_write(mq):
    mq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    before = snapshot(mq.client)
    with pytest.raises(ValueError) as refused:
        mq.remove_child_dependency("q", "p", ("bad queue!", "c1"))
    assert str(refused.value) == f"invalid queue name 'bad queue!': {QUEUE_RULE}"
    with pytest.raises(ValueError) as refused:
        mq.remove_child_dependency("q", "p", "other:{q}:job:c1")
    assert str(refused.value) == (
        "job key 'other:{q}:job:c1' is under prefix 'other', but this EchoMQ's "
        "prefix is 'emq': pass JobRef(queue, id)"
    )
    assert snapshot(mq.client) == before
    outcome = mq.remove_child_dependency("q", "p", "q/c1")  # str(ref) works too
    assert outcome.released == [] and mq.dependencies("q", "p").removed == {
        JobRef("q", "c1"): "dependency removed"
    }


# -- the old raw-key forms, for one release ------------------------------------


def deprecated(key: str, ref: JobRef) -> str:
    return re.escape(
        f"a raw Redis key as a job ref is deprecated: write {ref!r} instead of {key!r}"
    )


def test_a_raw_key_still_finds_a_child_in_the_results_with_a_warning(mq):
    mq.add_flow(node("p", [leaf("c1"), leaf("c2", ignore_dependency_on_failure=True), leaf("c3")]))
    complete(mq, "c1", {"n": 1})
    kill(mq, "c2", "gone")
    values, ignored = mq.children_values("q", "p"), mq.ignored_failures("q", "p")
    deps = mq.dependencies("q", "p")
    assert list(values) == [JobRef("q", "c1")] and list(ignored) == [JobRef("q", "c2")]
    k1, k2, k3 = (mq.keys.job("q", i) for i in ("c1", "c2", "c3"))
    lookups = [
        (lambda: values[k1], {"n": 1}, k1),
        (lambda: values.get(k1), {"n": 1}, k1),
        (lambda: k1 in values, True, k1),
        (lambda: ignored[k2], "gone", k2),
        (lambda: deps.processed.get(k1), {"n": 1}, k1),
        (lambda: deps.ignored[k2], "gone", k2),
        (lambda: k3 in deps.unprocessed, True, k3),
        (lambda: k3 in values, False, k3),
    ]
    for lookup, expected, key in lookups:
        ref = JobRef(*mq.keys.parse_ref(key))
        with pytest.warns(DeprecationWarning, match=f"^{deprecated(key, ref)}$") as caught:
            assert lookup() == expected
        assert [w.filename for w in caught] == [__file__]  # points at the caller
    assert values.get("nope") is None and "nope" not in values  # not a key: no warning


def test_remove_child_dependency_still_takes_a_raw_key_with_a_warning(mq):
    mq.add_flow(node("p", [leaf("c1"), leaf("c2")]))
    key = mq.keys.job("q", "c1")
    with pytest.warns(DeprecationWarning, match=f"^{deprecated(key, JobRef('q', 'c1'))}$") as w:
        mq.remove_child_dependency("q", "p", key)
    assert [x.filename for x in w] == [__file__]
    assert mq.dependencies("q", "p").removed == {JobRef("q", "c1"): "dependency removed"}


# -- no key anywhere in what the public API gives ------------------------------


def orders_flow(order: str) -> Flow:
    """o1: an ``fp`` charge that dies fails the root; under validation, an
    ignored line dies and a flaky one retries once (``job_failed``)."""
    return Flow(
        "orders",
        "t.echo",
        "root",
        job_id=order,
        children=[
            Flow(
                "validation",
                "t.echo",
                job_id=f"v-{order}",
                children=[
                    Flow("inventory", "t.echo", 1, job_id=f"r-{order}-0"),
                    Flow(
                        "inventory",
                        "t.flaky",
                        {"fail_times": 1},
                        job_id=f"r-{order}-1",
                        max_attempts=2,
                        backoff_ms=0,
                    ),
                    Flow(
                        "inventory",
                        "t.fail",
                        {"message": "out of stock"},
                        job_id=f"r-{order}-2",
                        max_attempts=1,
                        ignore_dependency_on_failure=True,
                    ),
                ],
            ),
            Flow(
                "payments",
                "t.fail",
                {"message": "card declined"},
                job_id=f"c-{order}",
                max_attempts=1,
            ),
        ],
    )


def chain_flow() -> Flow:
    """o2 <- validation v-o2 <- inventory x-o2, every death ``fp``: a chain."""
    return Flow(
        "orders",
        "t.echo",
        job_id="o2",
        children=[
            Flow(
                "validation",
                "t.echo",
                job_id="v-o2",
                children=[Flow("inventory", "t.fail", job_id="x-o2", max_attempts=1)],
            )
        ],
    )


def run_until_idle(mq) -> None:
    pump = Pump(list(QUEUES), mq=mq)
    for _ in range(10):  # bounded: each round moves the flows one level up
        ran = Worker(list(QUEUES), mq=mq).run(burst=True)
        pump.sweep()
        if not ran:
            return
    raise AssertionError("the flows did not settle in 10 rounds")


def test_no_public_result_holds_a_redis_key(mq):
    if isinstance(mq.client, RedisCluster):  # every queue on its own slot
        assert len({mq.client.keyslot(mq.keys.base(q)) for q in QUEUES}) == len(QUEUES)
    recorder = Recorder(
        ("job_completed", "job_failed", "job_dead", "parent_released", "flow_failed")
    )
    try:
        refs = [mq.add_flow(orders_flow("o1")), mq.add_flow(chain_flow())]
        run_until_idle(mq)
        Dispatcher(list(QUEUES), mq=mq).dispatch_all()
        events = [kw for _, _, kw in recorder.events]
    finally:
        recorder.close()
    results: list = [refs, events]
    for ref in refs:
        for queue, job_id in ref.nodes:
            results.append(mq.get_job(queue, job_id))
        for queue, job_id in ref.nodes[:2]:  # the parents
            results += [
                mq.children_values(queue, job_id),
                mq.ignored_failures(queue, job_id),
                mq.dependencies(queue, job_id),
                mq.dependencies(queue, job_id, 0, 2),
                mq.children_values(queue, job_id, 0, 2),
                mq.ignored_failures(queue, job_id, 0, 2),
                mq.get_flow(queue, job_id),
                mq.flow_page(queue, job_id),
            ]
    retried = mq.retry("orders", "o2")  # an Outcome reaching across queues
    results.append(retried)
    found = list(strings(results))
    assert len(found) > 200  # the walk saw the answers
    assert [s for s in found if "emq:" in s] == []
    # and they say the same things in queue/id words
    assert refs[0].ref == JobRef("orders", "o1")
    assert refs[0].children == [JobRef("validation", "v-o1"), JobRef("payments", "c-o1")]
    root = mq.get_job("orders", "o1")
    assert root.error == "failed by child payments/c-o1: ValueError: card declined"
    moved = retried.retried + retried.revived
    assert moved and all(type(r) is JobRef for r in moved)
    assert mq.dependencies("validation", "v-o1").ignored == {
        JobRef("inventory", "r-o1-2"): mq.get_job("inventory", "r-o1-2").error
    }
    assert mq.children_values("validation", "v-o1") == {
        JobRef("inventory", "r-o1-0"): 1,
        JobRef("inventory", "r-o1-1"): {"attempt": 2},
    }
    flow_failed = [kw for kw in events if "child" in kw]
    assert sorted((kw["ref"], kw["child"], kw["error"]) for kw in flow_failed) == [
        (
            JobRef("orders", "o1"),
            JobRef("payments", "c-o1"),
            "failed by child payments/c-o1: ValueError: card declined",
        ),
        (
            JobRef("orders", "o2"),
            JobRef("validation", "v-o2"),
            "failed by child validation/v-o2: failed by child inventory/x-o2: ValueError: boom",
        ),
        (
            JobRef("validation", "v-o2"),
            JobRef("inventory", "x-o2"),
            "failed by child inventory/x-o2: ValueError: boom",
        ),
    ]
    [failed] = [kw for kw in events if "run_at" in kw]  # job_failed, the worker's own
    assert failed["ref"] == JobRef("inventory", "r-o1-1")


# -- paged reads ---------------------------------------------------------------

N = 1000


def wide_parent(mq) -> None:
    """p on q with N children, half on q and half on o (another slot on the
    Cluster): every 3rd completed, every 5th else dead and ignored, three
    removed, the rest claimed and unresolved."""
    mq.add_flow(
        node(
            "p",
            [
                leaf(
                    f"c{i:04d}",
                    queue="q" if i % 2 else "o",
                    ignore_dependency_on_failure=i % 5 == 0,
                    max_attempts=1,
                )
                for i in range(N)
            ],
        )
    )
    for queue in ("q", "o"):
        while jobs := mq.claim(queue, 200):
            mq.complete_many([(j, int(j.id[1:])) for j in jobs if int(j.id[1:]) % 3 == 0])
            dead = [
                (j, f"no {j.id}", True)
                for j in jobs
                if int(j.id[1:]) % 3 and int(j.id[1:]) % 5 == 0
            ]
            if dead:
                mq.fail_many(dead)
    Pump(["o"], mq=mq).sweep()
    for i in (1, 2, 7):
        mq.remove_child_dependency("q", "p", JobRef("q" if i % 2 else "o", f"c{i:04d}"))


def test_pages_hold_every_child_exactly_once_and_respect_count(mq):
    wide_parent(mq)
    whole = mq.dependencies("q", "p")
    assert (len(whole.processed), len(whole.ignored), len(whole.removed)) == (334, 133, 3)
    assert len(whole.unprocessed) == N - 334 - 133 - 3 and whole.failed == {}
    seen: list[JobRef] = []
    parts: dict[str, dict] = {"processed": {}, "failed": {}, "ignored": {}, "removed": {}}
    cursors, cursor = [], 0
    while True:
        page = mq.dependencies("q", "p", cursor=cursor, count=64)
        assert isinstance(page, Page) and page.total == N
        deps = page.items
        on_page = [*deps.processed, *deps.failed, *deps.ignored, *deps.removed, *deps.unprocessed]
        assert len(on_page) == min(64, N - cursor)  # every child of the window, once
        assert deps.remaining == whole.remaining
        seen += on_page
        for name, got in parts.items():
            got.update(getattr(deps, name))
        cursor = page.next_cursor
        cursors.append(cursor)
        if not cursor:
            break
    assert cursors == [*range(64, N, 64), 0]
    assert len(seen) == len(set(seen)) == N
    assert set(seen) == {JobRef("q" if i % 2 else "o", f"c{i:04d}") for i in range(N)}
    for name, got in parts.items():
        assert got == getattr(whole, name), name
    for read in ("children_values", "ignored_failures"):
        union, cursor = {}, 0
        while True:
            page = getattr(mq, read)("q", "p", cursor, 100)
            assert len(page.items) <= 100 and not set(page.items) & set(union)
            union.update(page.items)
            cursor = page.next_cursor
            if not cursor:
                break
        assert union == getattr(mq, read)("q", "p"), read
    job = mq.get_job("q", "p")
    first = job.children_values(count=10)
    assert (first.next_cursor, first.total, list(first.items)) == (
        10,
        N,
        [JobRef("o", "c0000"), JobRef("q", "c0003"), JobRef("o", "c0006"), JobRef("q", "c0009")],
    )
    assert job.children_values(count=10) is not first  # pages are not cached
    past = mq.dependencies("q", "p", cursor=N + 5, count=10)
    assert (past.next_cursor, past.total, past.items.unprocessed) == (0, N, [])


def test_a_bad_cursor_or_count_is_refused(mq):
    mq.add_flow(node("p", [leaf("c1")]))
    before = snapshot(mq.client)
    for kwargs, message in (
        ({"count": 0}, "count must be a whole number >= 1, got 0"),
        ({"count": 10_001}, "count must be at most 10000 children a page, got 10001"),
        ({"count": 1.5}, "count must be a whole number >= 1, got 1.5"),
        ({"cursor": -1, "count": 5}, "cursor must be a whole number >= 0, got -1"),
    ):
        for read in ("dependencies", "children_values", "ignored_failures"):
            with pytest.raises(ValueError) as refused:
                getattr(mq, read)("q", "p", **kwargs)
            assert str(refused.value) == message
    assert snapshot(mq.client) == before


Row = SimpleNamespace  # a MirroredJob as job_page reads it while Redis answers


def test_the_admin_job_page_reads_one_page_of_a_wide_parent(mq):
    """The page of a live parent reads one page of its children (the row is
    only asked for its queue and id while Redis answers)."""
    wide_parent(mq)
    ctx = job_page(mq, Row(queue="q", job_id="p"))
    assert (ctx["deps"]["children"], ctx["pager"]["next"], ctx["pager"]["last"]) == (
        N,
        2,
        CHILDREN_PER_PAGE,
    )
    window = {JobRef("q" if i % 2 else "o", f"c{i:04d}") for i in range(CHILDREN_PER_PAGE)}
    rows = ctx["ignored"] + ctx["removed"] + ctx["failed"] + ctx["unprocessed"]
    listed = {JobRef(r["queue"], r["id"]) for r in rows}
    assert listed <= window and len(rows) == len(listed)
    assert len(ctx["tree"]) == CHILDREN_PER_PAGE
    assert [s for s in strings({k: v for k, v in ctx.items() if k != "live"}) if "emq:" in s] == []
    second = job_page(mq, Row(queue="q", job_id="p"), page=2)
    assert (
        second["pager"]["previous"] == 1 and second["tree"][0]["id"] == f"c{CHILDREN_PER_PAGE:04d}"
    )


def test_the_module_api_takes_refs_and_warns_at_the_caller_for_a_raw_key(r):
    import echomq_django as emq
    from echomq_django.conf import get_mq

    mq = get_mq()  # the settings' client: the private single server, flushed by r
    mq.add_flow(node("p", [leaf("c1"), leaf("c2"), leaf("c3")]))
    key = mq.keys.job("q", "c1")
    with pytest.warns(DeprecationWarning, match=f"^{deprecated(key, JobRef('q', 'c1'))}$") as w:
        emq.remove_child_dependency("q", "p", key)
    assert [x.filename for x in w] == [__file__]
    emq.remove_child_dependency("q", "p", JobRef("q", "c2"))
    assert emq.dependencies("q", "p").removed == {
        JobRef("q", "c1"): "dependency removed",
        JobRef("q", "c2"): "dependency removed",
    }
    page = emq.dependencies("q", "p", cursor=2, count=5)
    assert (page.next_cursor, page.total, page.items.unprocessed) == (0, 3, [JobRef("q", "c3")])
    assert emq.children_values("q", "p", 0, 5).items == {}
    assert emq.ignored_failures("q", "p", 0, 5).items == {}


def test_get_cancel_remove_and_retry_take_a_ref_as_wait_does(r):
    """What ``add_flow`` and a canvas's ``enqueue`` return (a ``JobRef``)
    goes straight to the calls that act on one job, in the module API and on
    ``EchoMQ``, as ``"queue/id"`` too; a queue name without its id is refused
    before any write, naming the form."""
    import echomq_django as emq
    from echomq_django.conf import get_mq

    mq = get_mq()
    for job_id in ("a", "b", "c", "d"):
        mq.enqueue("q", "t.echo", {}, job_id=job_id)
    assert (emq.get_job(JobRef("q", "a")).id, mq.get_job("q/a").id) == ("a", "a")
    assert emq.cancel(JobRef("q", "a")).state == "pending"
    assert (mq.cancel("q/b").state, emq.get_job("q/b").state) == ("pending", "dead")
    assert emq.retry(JobRef("q", "a")).state == "pending"
    assert mq.retry("q/b").state == "pending"
    assert (emq.remove("q/c").removed, mq.remove(JobRef("q", "d")).removed) == (1, 1)
    before = sorted(mq.client.keys("*"))
    for call in (emq.get_job, emq.cancel, emq.remove, emq.retry, mq.get_job, mq.cancel):
        with pytest.raises(ValueError, match="^invalid job ref 'q': write 'queue/id'"):
            call("q")
    assert sorted(mq.client.keys("*")) == before


def test_a_result_keyed_by_job_refs_is_stored_with_queue_slash_id_keys(mq):
    mq.add_flow(node("p", [leaf("c1"), leaf("c2", queue="o")]))
    complete(mq, "c1", 1)
    complete(mq, "c2", {"n": 2}, queue="o")
    Pump(["o"], mq=mq).sweep()
    [parent] = mq.claim("q", 1)
    mq.complete(parent, {"values": parent.children_values(), "refs": [JobRef("q", "c1")]})
    assert mq.get_job("q", "p").result == {
        "values": {"q/c1": 1, "o/c2": {"n": 2}},
        "refs": [["q", "c1"]],
    }
    with pytest.raises(PayloadError, match="^result is not JSON-serialisable: "):
        mq.encode({JobRef("q", "c1"): object()}, "result")
