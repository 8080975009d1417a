"""Enqueue on commit (echomq_django.api): inside an atomic
block ``enqueue`` / ``add_flow`` wait for the commit by default, a rollback
writes nothing, and the ids are known before the commit."""

from __future__ import annotations

import contextlib
import copy
import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models.signals import post_save

import echomq_django as emq
from echomq_django import EchoMQ, Flow, FlowError, JobNotFound, JobState, conf
from echomq_django import commit_outbox as outbox
from echomq_django.commit_outbox import Drainer
from echomq_django.models import OutboxEntry
from tests.support.rigs import free_port
from tests.support.workerkit import burst, run_async


class Rollback(Exception):
    pass


@pytest.fixture
def mq(r, transactional_db):
    """The settings' EchoMQ (module-level API), on the private server."""
    conf.reset()
    yield EchoMQ(r, prefix="emq")
    conf.reset()


def landed(mq, queue, job_id) -> bool:
    try:
        mq.get_job(queue, job_id)
    except JobNotFound:
        return False
    return True


def test_a_rolled_back_block_enqueues_nothing(mq):
    with pytest.raises(Rollback), transaction.atomic():
        job_id = emq.enqueue("q", "t.echo", 1)
        ref = emq.add_flow(Flow("q", "t.sum_children", children=[Flow("q", "t.echo", 2)]))
        raise Rollback
    assert isinstance(job_id, str) and isinstance(ref.parent_id, str)
    assert mq.client.keys("*") == []


def test_a_job_read_or_waited_for_in_its_own_transaction_says_it_lands_at_commit(mq):
    """The module API's ``get_job`` and ``wait`` inside ``atomic()`` do not
    find a job enqueued there (it lands at the commit), and say so; outside
    a transaction the error is the plain one."""
    hint = re.escape(
        "; this runs inside transaction.atomic(): if it was enqueued in that transaction, "
        "it lands in Redis when it commits: read or wait for it after the block"
    )
    with transaction.atomic():
        job_id = emq.enqueue("q", "t.echo", 1)
        plain = f"^job '{re.escape(job_id)}' not found in queue 'q'"
        with pytest.raises(JobNotFound, match=f"{plain}{hint}$"):
            emq.get_job("q", job_id)
        with pytest.raises(JobNotFound, match=f"'{re.escape(job_id)}'.*{hint}$"):
            emq.wait("q", job_id, 0)
    assert emq.get_job("q", job_id).state == JobState.PENDING
    with pytest.raises(JobNotFound, match="^job 'nope' not found in queue 'q'$"):
        emq.get_job("q", "nope")


def test_a_committed_block_lands_after_the_commit_with_the_ids_given_before(mq):
    with transaction.atomic():
        job_id = emq.enqueue("q", "t.echo", 1)
        ref = emq.add_flow(
            Flow("q", "t.sum_children", job_id="p", children=[Flow("q", "t.echo", 2, job_id="c")])
        )
        assert (ref.parent_id, ref.child_ids) == ("p", ["c"])
        assert not landed(mq, "q", job_id) and not landed(mq, "q", "p")
    assert mq.get_job("q", job_id).state is JobState.PENDING
    assert mq.get_job("q", "p").state is JobState.AWAITING_CHILDREN
    assert mq.job_ids("q", "pending") == [job_id, "c"]


def test_generated_flow_ids_are_the_ones_that_land(mq):
    with transaction.atomic():
        ref = emq.add_flow(Flow("q", "t.sum_children", children=[Flow("q", "t.echo", 2)]))
    [child] = ref.child_ids
    assert mq.get_job("q", ref.parent_id).state is JobState.AWAITING_CHILDREN
    assert mq.get_job("q", child).parent == ref.parent_id


def test_on_commit_false_writes_at_once_even_when_rolled_back(mq):
    with pytest.raises(Rollback), transaction.atomic():
        job_id = emq.enqueue("q", "t.echo", 1, on_commit=False)
        raise Rollback
    assert landed(mq, "q", job_id)


def test_outside_a_transaction_it_writes_at_once(mq):
    job_id = emq.enqueue("q", "t.echo", 1)
    assert landed(mq, "q", job_id)
    job_id = emq.enqueue("q", "t.echo", 1, on_commit=True)  # no transaction: runs now
    assert landed(mq, "q", job_id)


def test_a_bad_call_raises_in_the_caller_not_at_commit(mq):
    with pytest.raises(ValueError), transaction.atomic():
        emq.enqueue("bad queue", "t.echo", 1)
    with pytest.raises(ValueError), transaction.atomic():
        emq.enqueue("q", "t.echo", object())
    assert mq.client.keys("*") == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be a whole number >= 1, got 0"),
        ({"max_attempts": "x"}, "max_attempts must be a whole number >= 1, got 'x'"),
        ({"backoff_ms": -1}, "backoff_ms must be a whole number >= 0 (ms), got -1"),
    ],
)
def test_a_deferred_enqueue_checks_its_attempts_now(mq, options, message):
    # refused at the push, after the commit, it was lost: an outbox row kept
    # and skipped, and no job
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"), transaction.atomic():
        emq.enqueue("q", "t.echo", 1, **options)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        emq.enqueue("q", "t.echo", 1, on_commit=True, **options)
    assert not OutboxEntry.objects.exists()
    assert mq.client.keys("*") == []


def test_deferred_add_flows_add_none_when_one_is_bad(mq):
    flows = lambda: [Flow("q", "t.echo", job_id="good"), Flow("q", "")]  # noqa: E731
    with pytest.raises(FlowError, match="needs a job name"):
        emq.add_flows(flows(), on_commit=True)  # no transaction: at once, all or nothing
    with pytest.raises(FlowError, match="needs a job name"), transaction.atomic():
        emq.add_flows(flows())
    assert not OutboxEntry.objects.exists()
    assert mq.client.keys("*") == []


@contextlib.contextmanager
def welcome_flows(*children: Flow):
    """A ``post_save`` receiver on ``User`` that adds the flow
    ``welcome-<username>`` (``t.sum_children`` over ``children``) for each new
    user, as a project's receiver would; yields the list of its ``FlowRef``s."""
    refs = []

    def start_flow(sender, instance, created, **kwargs):
        if created:
            flow = Flow(
                "q",
                "t.sum_children",
                job_id=f"welcome-{instance.username}",
                children=[copy.deepcopy(c) for c in children],
            )
            refs.append(emq.add_flow(flow))

    post_save.connect(start_flow, sender=User, weak=False)
    try:
        yield refs
    finally:
        post_save.disconnect(start_flow, sender=User)


def test_a_post_save_receiver_starts_a_flow_only_for_a_committed_row(mq):
    with welcome_flows(Flow("q", "t.echo", 1)) as refs:
        with pytest.raises(Rollback), transaction.atomic():
            User.objects.create(username="gone")
            raise Rollback
        with transaction.atomic():
            User.objects.create(username="kept")
    assert [ref.parent_id for ref in refs] == ["welcome-gone", "welcome-kept"]
    assert not landed(mq, "q", "welcome-gone")
    assert mq.get_job("q", "welcome-kept").state is JobState.AWAITING_CHILDREN
    assert mq.counts("q")["awaiting_children"] == 1


def test_redis_down_at_commit_the_flow_waits_in_the_outbox_and_runs_once(mq, monkeypatch):
    """The issue's case: a post_save receiver adds a flow while Redis is down.
    The order row commits, the flow waits in the outbox, and once Redis is
    back a worker pushes it before its first claim and runs it, once."""
    monkeypatch.setenv("ECHOMQ_URL", f"redis://127.0.0.1:{free_port()}/0")
    conf.reset()

    with welcome_flows(Flow("q", "t.echo", 1, job_id="c1"), Flow("q", "t.echo", 2)):
        with transaction.atomic():
            User.objects.create(username="kept")
            job_id = emq.enqueue("q", "t.echo", {"n": 3})
    assert User.objects.filter(username="kept").exists()
    assert outbox.pending() == 2 and mq.client.keys("*") == []
    _, processed = burst(mq, ["q"], drainer=Drainer(mq))
    assert processed == 4 and outbox.pending() == 0
    assert mq.get_job("q", "welcome-kept").result == 3
    assert mq.get_job("q", job_id).result == {"n": 3}
    assert [mq.get_job("q", i).attempts for i in ("welcome-kept", "c1", job_id)] == [1, 1, 1]


def test_aenqueue_and_aadd_flow(mq):
    job_id = run_async(emq.aenqueue, "q", "t.echo", 1, job_id="a1")
    ref = run_async(emq.aadd_flow, Flow("q", "t.echo", 2, job_id="a2"))
    assert (job_id, ref.parent_id) == ("a1", "a2")
    assert mq.job_ids("q", "pending") == ["a1", "a2"]

    async def in_a_transaction():
        @sync_to_async
        def block():
            with transaction.atomic():
                async_to_sync(emq.aenqueue)("q", "t.echo", 3, job_id="a3")
                assert not landed(mq, "q", "a3")

        await block()

    run_async(in_a_transaction)
    assert landed(mq, "q", "a3")


def test_enqueue_many_waits_for_the_commit_with_its_ids_fixed(mq):
    with transaction.atomic():
        ids = emq.enqueue_many("q", [("t.echo", 1), ("t.echo", 2, {"job_id": "mine"})])
        assert ids[1] == "mine" and not landed(mq, "q", ids[0])
    assert mq.job_ids("q", "pending") == ids
    with pytest.raises(Rollback), transaction.atomic():
        emq.enqueue_many("q", [("t.echo", 3, {"job_id": "gone"})])
        raise Rollback
    assert not landed(mq, "q", "gone")
    with pytest.raises(ValueError, match="job 0 needs a name"), transaction.atomic():
        emq.enqueue_many("q", [("", 3)])  # checked now, not at commit
    assert emq.enqueue_many("q", [("t.echo", 4, {"job_id": "now"})], on_commit=False) == ["now"]


def test_a_deferred_enqueue_many_keeps_each_jobs_keep(mq):
    with transaction.atomic():
        emq.enqueue_many("q", [("t.echo", 1, {"job_id": "k0", "keep": 0}), ("t.echo", 2)])
        emq.enqueue_many("q", [("t.echo", 3, {"job_id": "k9", "keep": 9})])
    row = {i: mq.client.hget(mq.keys.job("q", i), "keep") for i in ("k0", "k9")}
    assert row == {"k0": b"0", "k9": b"9000"}  # ms, as enqueue_many writes it now
    with pytest.raises(ValueError, match="job 0: keep must be a whole"), transaction.atomic():
        emq.enqueue_many("q", [("t.echo", 4, {"keep": -1})])  # checked now, not at commit
    assert len(mq.job_ids("q", "pending")) == 3
