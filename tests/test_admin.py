"""The admin and its mirror (what Redis holds, copied into tables), through
the Django test client: read-only pages, and retry by id behind its
permission.

Every test builds the same small world on the private Redis, one flow per
queue so each can be driven by claiming in FIFO order:

=========  ==========================================================
queue      what it holds
=========  ==========================================================
awaiting   ``aw`` awaiting_children: ``aw-1`` completed, ``aw-2`` pending
released   ``rel`` released (pending): ``rel-1`` completed
completed  ``done`` completed on ``done-1``'s result
failed     ``fp`` dead, failed by ``fp-1`` (policy fp, error with HTML)
ignored    ``ign`` released: ``ign-bad`` dead but ignored (id), ``ign-ok`` completed
orders     ``xo`` released by the pump: children ``validation/xo-v``, ``payments/xo-p``
html       ``xss`` pending, payload ``<script>alert(1)</script>``
=========  ==========================================================

The views use the ``EchoMQ`` from settings (``conf.get_mq()``: the private
server through ``ECHOMQ_URL``) with a fake clock, so timestamps are exact.
"""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
import redis
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.messages import get_messages
from django.core.management import CommandError, call_command
from django.urls import reverse
from redis.backoff import NoBackoff
from redis.retry import Retry

from echomq_django import EchoMQ, Flow, conf
from echomq_django.admin.pages import job_url
from echomq_django.models import TEXT_LIMIT, MirroredJob, MirroredQueue
from echomq_django.monitoring.mirror import mirror_after_sweep, mirror_queue, mirror_queues
from echomq_django.runners.pump import Pump
from tests.support.factories import StaffUserFactory, UserFactory

pytestmark = pytest.mark.django_db

QUEUES = [
    "awaiting",
    "released",
    "completed",
    "failed",
    "ignored",
    "orders",
    "validation",
    "payments",
    "html",
]
XSS = "<script>alert(1)</script>"
XSS_ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"
CHANGELIST = "admin:echomq_django_mirroredjob_changelist"
STATES = {
    ("awaiting", "aw"): "awaiting_children",
    ("awaiting", "aw-1"): "completed",
    ("awaiting", "aw-2"): "pending",
    ("released", "rel"): "pending",
    ("released", "rel-1"): "completed",
    ("completed", "done"): "completed",
    ("completed", "done-1"): "completed",
    ("failed", "fp"): "dead",
    ("failed", "fp-1"): "dead",
    ("ignored", "ign"): "pending",
    ("ignored", "ign-bad"): "dead",
    ("ignored", "ign-ok"): "completed",
    ("orders", "xo"): "pending",
    ("validation", "xo-v"): "completed",
    ("payments", "xo-p"): "completed",
    ("html", "xss"): "pending",
}


T0 = 1_700_000_000_000  # ms


class Ticks:
    """A fake ``EchoMQ.clock`` (ms since the epoch) that moves only on ``tick``."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now

    def tick(self, ms: int = 1000) -> None:
        self.now += ms


def snapshot(client) -> dict:
    """Every key of the private server with its DUMP (streams included)."""
    return {k: client.dump(k) for k in client.scan_iter()}


@pytest.fixture
def emq(r):
    """The settings' ``EchoMQ`` on the private server, on a fake clock."""
    conf.reset()
    mq = conf.get_mq()
    mq.clock = Ticks()
    yield mq
    conf.reset()


def step(mq: EchoMQ, queue: str, job_id: str, result=None, error: str | None = None) -> None:
    """Claim ``job_id`` (the head of ``queue``), then complete it or fail it dead."""
    mq.clock.tick()
    [job] = mq.claim(queue, 1)
    assert job.id == job_id
    if error is None:
        mq.complete(job, result)
    else:
        mq.fail(job, error, dead=True)


def add(mq: EchoMQ, flow: Flow) -> None:
    mq.clock.tick()
    mq.add_flow(flow)


def leaf(queue: str, job_id: str, **kw) -> Flow:
    return Flow(queue, "t.leaf", {"id": job_id}, job_id=job_id, **kw)


@pytest.fixture
def world(emq):
    """The flows of the module docstring, mirrored."""
    mq = emq
    add(
        mq,
        Flow(
            "awaiting",
            "t.parent",
            {"n": 2},
            job_id="aw",
            children=[leaf("awaiting", "aw-1"), leaf("awaiting", "aw-2")],
        ),
    )
    step(mq, "awaiting", "aw-1", {"n": 1})
    add(mq, Flow("released", "t.parent", {}, job_id="rel", children=[leaf("released", "rel-1")]))
    step(mq, "released", "rel-1", {"ok": True})
    add(
        mq, Flow("completed", "t.parent", {}, job_id="done", children=[leaf("completed", "done-1")])
    )
    step(mq, "completed", "done-1", 1)
    step(mq, "completed", "done", {"total": 1})
    add(mq, Flow("failed", "t.parent", {}, job_id="fp", children=[leaf("failed", "fp-1")]))
    step(mq, "failed", "fp-1", error="card <b>declined</b>")
    add(
        mq,
        Flow(
            "ignored",
            "t.parent",
            {},
            job_id="ign",
            children=[
                leaf("ignored", "ign-bad", ignore_dependency_on_failure=True),
                leaf("ignored", "ign-ok"),
            ],
        ),
    )
    step(mq, "ignored", "ign-bad", error="flaky")
    step(mq, "ignored", "ign-ok", "fine")
    add(
        mq,
        Flow(
            "orders",
            "orders.fulfil",
            {"order": 1},
            job_id="xo",
            children=[leaf("validation", "xo-v"), leaf("payments", "xo-p")],
        ),
    )
    step(mq, "validation", "xo-v", {"valid": True})
    step(mq, "payments", "xo-p", {"charged": 5})
    assert mq.get_job("orders", "xo").state == "pending"  # released by xo-p's completion
    mq.clock.tick()
    mq.enqueue("html", "t.render", {"html": XSS}, job_id="xss")
    mirror_queues(mq, QUEUES)
    return mq


def mirrored(**filters) -> dict[tuple[str, str], str]:
    return {(j.queue, j.job_id): j.state for j in MirroredJob.objects.filter(**filters)}


def rows_without_time() -> list[dict]:
    return list(
        MirroredJob.objects.order_by("pk").values(
            *[f.name for f in MirroredJob._meta.concrete_fields if f.name != "mirrored_at"]
        )
    )


def messages_of(response) -> list[str]:
    """The messages a (not followed) response queued."""
    return [str(m) for m in get_messages(response.wsgi_request)]


def shown(response) -> list[str]:
    """The messages a rendered (followed) page showed."""
    return [str(m) for m in response.context["messages"]]


@pytest.fixture
def staff(client):
    client.force_login(StaffUserFactory())
    return client


@pytest.fixture
def retrier(client):
    user = StaffUserFactory(permissions=["retry_job"])
    client.force_login(user)
    client.user = user
    return client


def page(client, queue: str, job_id: str):
    """The admin page of one job, through the lookup redirect."""
    response = client.get(job_url(queue, job_id), follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[0][0] == reverse(
        "admin:echomq_django_mirroredjob_change",
        args=[MirroredJob.objects.get(queue=queue, job_id=job_id).pk],
    )
    return response


# -- the mirror --------------------------------------------------------------


def test_mirror_holds_every_job_with_its_state_parent_and_times(world):
    assert mirrored() == STATES
    child = MirroredJob.objects.get(queue="validation", job_id="xo-v")
    assert (child.parent_queue, child.parent_id, child.parent_policy) == ("orders", "xo", "fp")
    assert (child.name, child.attempts, child.max_attempts) == ("t.leaf", 1, 3)
    assert child.payload == '{"id":"xo-v"}' and child.result == '{"valid":true}'
    assert (
        child.started_at == child.finished_at == datetime.fromtimestamp((T0 + 14000) / 1000, tz=UTC)
    )
    assert child.created_at == datetime.fromtimestamp((T0 + 13000) / 1000, tz=UTC)
    fp1 = MirroredJob.objects.get(queue="failed", job_id="fp-1")
    assert (fp1.error, fp1.gone_from_redis, fp1.truncated) == ("card <b>declined</b>", False, False)
    ign = MirroredQueue.objects.get(queue="ignored")
    assert ign.counts() == {
        "pending": 1,
        "active": 0,
        "delayed": 0,
        "awaiting_children": 0,
        "completed": 1,
        "dead": 1,
        "outbox": 0,
        "deadletter": 0,
    }
    assert ign.oldest_pending_age_s == 4.0  # released at T0+12000, mirrored at T0+16000
    assert (
        ign.last_event_id == world.client.xrevrange("emq:{ignored}:events", count=1)[0][0].decode()
    )


def test_mirror_twice_gives_the_same_rows(world):
    before = rows_without_time()
    assert mirror_queues(world, QUEUES)["failed"] == {
        "full": False,
        "events": 0,
        "jobs": 0,
        "gone": 0,
        "changed": False,
    }
    mirror_queues(world, QUEUES, full=True)
    assert rows_without_time() == before
    assert MirroredQueue.objects.count() == len(QUEUES)


def test_incremental_mirror_reads_only_new_events_and_unevented_claims(world):
    step(world, "awaiting", "aw-2", {"n": 2})  # active + completed + released: three events
    report = mirror_queue(world, "awaiting")
    assert report == {"full": False, "events": 3, "jobs": 2, "gone": 0, "changed": True}
    assert mirrored(queue="awaiting") == {
        ("awaiting", "aw"): "pending",
        ("awaiting", "aw-1"): "completed",
        ("awaiting", "aw-2"): "completed",
    }
    assert [j.id for j in world.claim("awaiting", 1)] == ["aw"]  # one 'active' event
    assert mirror_queue(world, "awaiting")["jobs"] == 1
    assert MirroredJob.objects.get(queue="awaiting", job_id="aw").state == "active"
    world.enqueue("awaiting", "t.leaf", {}, job_id="later", delay_ms=5000)
    mirror_queue(world, "awaiting")
    world.clock.tick(5000)
    assert world.timers.promote_delayed("awaiting") == 1  # a 'promoted' event
    assert mirror_queue(world, "awaiting") == {
        "full": False,
        "events": 1,
        "jobs": 1,
        "gone": 0,
        "changed": True,
    }
    assert MirroredJob.objects.get(queue="awaiting", job_id="later").state == "pending"


def test_mirror_on_both_rigs(mq):
    mq.enqueue("orders", "t.leaf", {"n": 1}, job_id="a")
    mq.enqueue("orders", "t.leaf", {"n": 2}, job_id="b")
    assert mirror_queue(mq, "orders")["full"] is True
    [job] = mq.claim("orders", 1)
    mq.complete(job, "ok")
    assert mirror_queue(mq, "orders") == {
        "full": False,
        "events": 2,  # active, completed
        "jobs": 1,
        "gone": 0,
        "changed": True,
    }
    assert mirrored() == {("orders", "a"): "completed", ("orders", "b"): "pending"}
    assert MirroredQueue.objects.get(queue="orders").counts()["completed"] == 1


def test_trimmed_stream_falls_back_to_a_full_rescan(world):
    step(world, "awaiting", "aw-2", {"n": 2})
    world.client.xtrim("emq:{awaiting}:events", maxlen=0)
    world.enqueue("awaiting", "t.leaf", {}, job_id="late")
    report = mirror_queue(world, "awaiting")
    assert (report["full"], report["jobs"]) == (True, 4)
    assert mirrored(queue="awaiting")[("awaiting", "aw-2")] == "completed"
    assert mirrored(queue="awaiting")[("awaiting", "late")] == "pending"


def test_a_job_gone_from_redis_leaves_the_mirror(world):
    world.client.delete("emq:{completed}:job:done-1")
    world.client.zrem("emq:{completed}:completed", "done-1")
    assert mirror_queue(world, "completed", full=True)["gone"] == 1
    assert not MirroredJob.objects.filter(queue="completed", job_id="done-1").exists()
    assert mirror_queue(world, "completed", full=True)["gone"] == 0  # deleted once


def test_long_values_are_trimmed_with_the_flag_set(emq):
    emq.enqueue("html", "t.big", {"blob": "x" * 5000}, job_id="big")
    mirror_queue(emq, "html")
    big = MirroredJob.objects.get(job_id="big")
    assert (len(big.payload), big.truncated) == (TEXT_LIMIT, True)


def test_pump_hook_mirrors_after_a_sweep_and_never_raises(emq, caplog):
    emq.enqueue("orders", "t.leaf", {}, job_id="j1")
    Pump(["orders"], mq=emq, after_sweep=[mirror_after_sweep]).sweep()
    assert mirrored() == {("orders", "j1"): "pending"}
    assert mirror_queue(emq, "orders")["changed"] is False  # nothing new: no writes
    broken = EchoMQ(
        redis.Redis(unix_socket_path="/nonexistent/emq.sock", retry=Retry(NoBackoff(), 0))
    )
    with caplog.at_level(logging.ERROR, logger="echomq_django.mirror"):
        mirror_after_sweep(SimpleNamespace(mq=broken), {"orders": None})
    assert caplog.records[-1].getMessage() == (
        "admin mirror failed after a sweep of orders; the pump carries on"
    )


def test_echomq_mirror_command(emq):
    emq.enqueue("orders", "t.leaf", {}, job_id="j1")
    emq.enqueue("payments", "t.leaf", {}, job_id="j2")
    out = io.StringIO()
    call_command("echomq_mirror", "orders", stdout=out)
    assert out.getvalue() == "orders: full rescan, 1 jobs mirrored, 0 marked gone\n"
    out = io.StringIO()
    call_command("echomq_mirror", stdout=out)  # the settings' queues
    assert out.getvalue().splitlines() == [
        "inventory: full rescan, 0 jobs mirrored, 0 marked gone",
        "orders: 0 events, 0 jobs mirrored, 0 marked gone",
        "payments: full rescan, 1 jobs mirrored, 0 marked gone",
        "validation: full rescan, 0 jobs mirrored, 0 marked gone",
    ]
    assert mirrored() == {("orders", "j1"): "pending", ("payments", "j2"): "pending"}


def test_echomq_mirror_refuses_an_unknown_queue_and_mirrors_nothing(emq):
    emq.enqueue("orders", "t.leaf", {}, job_id="j1")
    with pytest.raises(CommandError) as caught:
        call_command("echomq_mirror", "orders", "ordres", stdout=io.StringIO())
    assert str(caught.value).startswith(
        "echomq_mirror: unknown queue 'ordres': no job, setting or live process uses it; "
        "known queues: "
    )
    assert caught.value.returncode == 1
    assert not MirroredQueue.objects.exists() and mirrored() == {}
    with pytest.raises(CommandError, match="echomq_mirror: invalid queue name 'a b'"):
        call_command("echomq_mirror", "a b", stdout=io.StringIO())


# -- pages ---------------------------------------------------------------------


def test_staff_sees_the_job_list_newest_first_with_filters_and_search(world, staff):
    response = staff.get(reverse(CHANGELIST))
    assert response.status_code == 200
    cl = response.context["cl"]
    assert [(j.queue, j.job_id) for j in cl.result_list][:3] == [
        ("html", "xss"),
        ("payments", "xo-p"),
        ("validation", "xo-v"),
    ]
    assert cl.result_count == len(STATES)
    html = response.content.decode()
    assert "Last mirrored from Redis:" in html and "Refresh from Redis" in html
    dead = staff.get(reverse(CHANGELIST), {"state__exact": "dead"}).context["cl"]
    assert {(j.queue, j.job_id) for j in dead.result_list} == {
        ("failed", "fp"),
        ("failed", "fp-1"),
        ("ignored", "ign-bad"),
    }
    by_queue = staff.get(reverse(CHANGELIST), {"queue": "failed"}).context["cl"]
    assert {j.job_id for j in by_queue.result_list} == {"fp", "fp-1"}
    by_name = staff.get(reverse(CHANGELIST), {"name": "orders.fulfil"}).context["cl"]
    assert [j.job_id for j in by_name.result_list] == ["xo"]
    found = staff.get(reverse(CHANGELIST), {"q": "aw-1"}).context["cl"]
    assert [j.job_id for j in found.result_list] == ["aw-1"]
    # fp-1's parent link, breakable at its joints
    assert f'<a href="{job_url("failed", "fp")}">failed/<wbr>fp</a>' in html


def test_html_payload_is_escaped_in_list_and_page(world, staff):
    listing = staff.get(reverse(CHANGELIST)).content.decode()  # the error column
    assert "card &lt;b&gt;declined&lt;/b&gt;" in listing and "<b>declined" not in listing
    detail = page(staff, "html", "xss").content.decode()
    assert XSS_ESCAPED in detail and XSS not in detail
    failed = page(staff, "failed", "fp-1").content.decode()
    assert "card &lt;b&gt;declined&lt;/b&gt;" in failed and "<b>declined" not in failed


def tree(response) -> list[tuple]:
    return [
        (n["queue"], n["id"], n["state"], n["value"], n["error"]) for n in response.context["tree"]
    ]


def links(response, name: str) -> list[tuple]:
    return [(n["queue"], n["id"], n.get("text")) for n in response.context[name]]


def test_parent_pages_show_children_values_errors_and_counters(world, staff):
    aw = page(staff, "awaiting", "aw")
    assert (aw.context["live"].state, aw.context["to_finish"]) == ("awaiting_children", 1)
    assert tree(aw) == [
        ("awaiting", "aw-1", "completed", '{"n": 1}', ""),
        ("awaiting", "aw-2", "pending", "", ""),
    ]
    assert aw.context["deps"]["processed"] == 1  # its value is in the tree
    assert links(aw, "unprocessed") == [("awaiting", "aw-2", None)]
    assert aw.context["unprocessed"][0]["state"] == "pending"

    rel = page(staff, "released", "rel")
    assert (rel.context["live"].state, rel.context["to_finish"]) == ("pending", 0)

    done = page(staff, "completed", "done")
    assert (done.context["live"].state, done.context["result"]) == (
        "completed",
        '{\n  "total": 1\n}',
    )
    assert tree(done) == [("completed", "done-1", "completed", "1", "")]

    fp = page(staff, "failed", "fp")
    assert fp.context["live"].state == "dead"
    assert fp.context["error"] == "failed by child failed/fp-1: card <b>declined</b>"
    assert tree(fp) == [("failed", "fp-1", "dead", "", "card <b>declined</b>")]
    assert links(fp, "failed") == [("failed", "fp-1", "card <b>declined</b>")]
    # the fp death stays in the counter (for a retry) but is not work to finish
    assert (fp.context["to_finish"], fp.context["undelivered"]) == (0, 0)

    ign = page(staff, "ignored", "ign")
    assert (ign.context["live"].state, ign.context["to_finish"]) == ("pending", 0)
    assert links(ign, "ignored") == [("ignored", "ign-bad", "flaky")]
    assert ("ignored", "ign-ok", "completed", '"fine"', "") in tree(ign)
    assert links(ign, "failed") == []

    xo = page(staff, "orders", "xo")
    assert xo.context["live"].state == "pending"
    assert sorted(tree(xo)) == [  # the tree lists children in the order they were added
        ("payments", "xo-p", "completed", '{"charged": 5}', ""),
        ("validation", "xo-v", "completed", '{"valid": true}', ""),
    ]
    html = xo.content.decode()
    assert f'<a href="{job_url("validation", "xo-v")}">validation/xo-v</a>' in html


def test_child_page_links_up_to_its_parent_in_another_queue(world, staff):
    child = page(staff, "validation", "xo-v")
    assert child.context["summary"]["parent"]["url"] == job_url("orders", "xo")
    assert child.context["is_parent"] is False
    assert child.context["payload"] == '{\n  "id": "xo-v"\n}'
    html = child.content.decode()
    assert f'<a href="{job_url("orders", "xo")}">orders/xo</a>' in html


def test_job_page_of_a_job_gone_from_redis_shows_the_mirror(world, staff):
    world.client.delete("emq:{completed}:job:done-1")
    response = page(staff, "completed", "done-1")
    assert response.context["live"] is None
    assert "This job is not in Redis any more" in response.content.decode()
    assert staff.get(job_url("completed", "never")).status_code == 404


def test_queue_pages_show_counts_and_dead_lettered_entries(world, staff):
    add(
        world,
        Flow(
            "orders",
            "orders.fulfil",
            {},
            job_id="orphan",
            children=[leaf("validation", "orphan-v")],
        ),
    )
    world.client.delete("emq:{orders}:job:orphan")  # the parent vanishes
    step(world, "validation", "orphan-v", "v")
    assert Pump(["validation"], mq=world, max_tries=1).sweep()["validation"]["deadlettered"] == 1
    mirror_queues(world, ["validation"])
    listing = staff.get(reverse("admin:echomq_django_mirroredqueue_changelist"))
    assert listing.status_code == 200
    assert [q.queue for q in listing.context["cl"].result_list] == sorted(QUEUES)
    response = staff.get(reverse("admin:echomq_django_mirroredqueue_change", args=["validation"]))
    assert response.status_code == 200
    assert response.context["counts"] == {
        "pending": 0,
        "active": 0,
        "delayed": 0,
        "completed": 2,
        "dead": 0,
        "awaiting_children": 0,
        "outbox": 0,
        "deadletter": 1,
    }
    [letter] = response.context["deadletters"]
    assert (letter["kind"], letter["child"]["id"], letter["parent"]["id"], letter["reason"]) == (
        "done",
        "orphan-v",
        "orphan",
        "parent orders/orphan not found after 1 deliveries",
    )
    html = response.content.decode()
    assert f'<a href="{job_url("orders", "orphan")}">orders/orphan</a>' in html
    assert MirroredQueue.objects.get(queue="validation").deadletter == 1


def test_the_queue_page_shows_poison_dead_letters_as_their_raw_text(world, staff):
    """An entry that is not a JSON object (not JSON at all, a list) used to
    make the queue page a 500: ``reads.deadletters`` keeps it as its text."""
    world.client.rpush("emq:{validation}:flow:outbox", "not json {", "[1, 2]")
    assert Pump(["validation"], mq=world).sweep()["validation"]["deadlettered"] == 2
    response = staff.get(reverse("admin:echomq_django_mirroredqueue_change", args=["validation"]))
    assert response.status_code == 200
    rows = response.context["deadletters"]
    assert [(r["kind"], r["child"], r["raw"]) for r in rows] == [
        ("", None, "not json {"),
        ("", None, "[1, 2]"),
    ]
    assert [r["reason"] for r in rows] == [
        "malformed entry: not JSON (Expecting value: line 1 column 1 (char 0))",
        "malformed entry: a JSON list, not an object",
    ]
    assert "<pre>not json {</pre>" in response.content.decode()


def test_the_queue_page_counts_a_dead_letter_at_its_bound(world, staff):
    """1,001 poison entries: the dead-letter keeps 1,000 and every count
    (live, mirrored, shown) reads 1,000, with the bound said."""
    world.client.rpush("emq:{validation}:flow:outbox", *(f"poison {i}" for i in range(1001)))
    assert Pump(["validation"], mq=world).sweep()["validation"]["deadlettered"] == 1001
    mirror_queues(world, ["validation"])
    response = staff.get(reverse("admin:echomq_django_mirroredqueue_change", args=["validation"]))
    assert response.status_code == 200
    ctx = response.context
    assert (ctx["counts"]["deadletter"], len(ctx["deadletters"])) == (1000, 100)
    assert (ctx["deadletters_hidden"], ctx["deadletters_capped"]) == (900, 1000)
    assert ctx["deadletters"][0]["raw"] == "poison 1"  # the oldest kept; poison 0 dropped
    html = response.content.decode()
    assert "Dead-lettered outbox entries (1000)" in html
    assert "900 more not shown." in html
    assert "Only the newest 1000 are kept; older ones were dropped." in html
    assert MirroredQueue.objects.get(queue="validation").deadletter == 1000


def test_the_queue_page_shows_dead_lettered_signal_events(world, staff):
    from echomq_django import Dispatcher
    from tests.support.eventkit import Raising

    world.signal_events.subscribe(["validation"], ["completed"])
    add(world, Flow("validation", "t.leaf", {}, job_id="sig-1"))
    step(world, "validation", "sig-1", {"v": 1})
    bad = Raising({"sig-1"})
    try:
        Dispatcher(["validation"], mq=world, tries=1).dispatch("validation")
    finally:
        bad.close()
    [letter] = world.signal_events.deadlettered("validation")
    response = staff.get(reverse("admin:echomq_django_mirroredqueue_change", args=["validation"]))
    assert response.status_code == 200
    assert response.context["signals"] == {"pending": 0, "deadlettered": 1, "oldest_ms": None}
    [row] = response.context["signal_deadletters"]
    assert (row["event_id"], row["kind"], row["job"]["id"], row["value"], row["tries"]) == (
        letter["event_id"],
        "completed",
        "sig-1",
        '{"v":1}',
        1,
    )
    assert (
        row["reason"] == "tests.support.eventkit.Raising raised RuntimeError('no sig-1') (1 tries)"
    )
    html = response.content.decode()
    assert "Durable signals: 0 waiting to be sent; dead-lettered (1)" in html
    assert f'<a href="{job_url("validation", "sig-1")}">validation/sig-1</a>' in html


# -- read-only by permissions --------------------------------------------------


@pytest.mark.parametrize("who", ["staff", "superuser"])
def test_add_change_delete_are_refused(world, client, admin_user, who):
    client.force_login(admin_user if who == "superuser" else StaffUserFactory())
    job = MirroredJob.objects.get(queue="failed", job_id="fp")
    for model, pk in (("mirroredjob", job.pk), ("mirroredqueue", "failed")):
        base = f"admin:echomq_django_{model}"
        assert client.get(reverse(f"{base}_add")).status_code == 403
        assert client.post(reverse(f"{base}_add"), {}).status_code == 403
        assert client.get(reverse(f"{base}_change", args=[pk])).status_code == 200  # view
        assert client.post(reverse(f"{base}_change", args=[pk]), {}).status_code == 403
        assert client.get(reverse(f"{base}_delete", args=[pk])).status_code == 403
        assert client.post(reverse(f"{base}_delete", args=[pk]), {"post": "yes"}).status_code == 403
    assert MirroredJob.objects.filter(pk=job.pk).exists()


def test_non_staff_is_sent_to_login(world, client):
    client.force_login(UserFactory())
    login = reverse("admin:login")
    for url in (
        reverse(CHANGELIST),
        job_url("failed", "fp"),
        reverse("admin:echomq_django_mirroredjob_retry"),
        reverse("admin:echomq_django_mirroredqueue_changelist"),
    ):
        response = client.get(url)
        assert (response.status_code, response.url) == (302, f"{login}?next={url}")
    refresh = reverse("admin:echomq_django_mirroredjob_refresh")
    assert client.post(refresh).url == f"{login}?next={refresh}"


def test_refresh_button_is_post_only_and_mirrors(world, staff):
    world.enqueue("orders", "t.leaf", {}, job_id="new")
    refresh = reverse("admin:echomq_django_mirroredjob_refresh")
    assert staff.get(refresh).status_code == 405
    assert not MirroredJob.objects.filter(job_id="new").exists()
    response = staff.post(refresh)
    assert (response.status_code, response.url) == (302, reverse(CHANGELIST))
    assert messages_of(response) == [
        "Mirrored 10 queues from Redis: 1 job rows refreshed, 0 marked gone from Redis."
    ]
    assert mirrored(job_id="new") == {("orders", "new"): "pending"}


# -- retry by id ---------------------------------------------------------------


def action_post(client, jobs, confirmed: bool):
    data = {"action": "retry_dead_jobs", "_selected_action": [j.pk for j in jobs]}
    if confirmed:
        data["post"] = "yes"
    return client.post(reverse(CHANGELIST), data)


def test_retry_is_refused_without_its_permission(world, staff):
    listing = staff.get(reverse(CHANGELIST)).content.decode()
    assert "retry_dead_jobs" not in listing and "Retry by id" not in listing
    before = snapshot(world.client)
    dead = MirroredJob.objects.get(queue="failed", job_id="fp-1")
    assert action_post(staff, [dead], confirmed=True).status_code in (200, 302)
    form = reverse("admin:echomq_django_mirroredjob_retry")
    assert staff.get(form).status_code == 403
    assert (
        staff.post(form, {"queue": "failed", "job_id": "fp-1", "confirm": "yes"}).status_code == 403
    )
    assert snapshot(world.client) == before
    assert LogEntry.objects.count() == 0


def test_retry_action_asks_then_retries_and_reattaches_the_dead_child(world, retrier):
    assert "retry_dead_jobs" in retrier.get(reverse(CHANGELIST)).content.decode()
    dead = MirroredJob.objects.get(queue="failed", job_id="fp-1")
    waiting = MirroredJob.objects.get(queue="awaiting", job_id="aw")
    before = snapshot(world.client)
    confirm = action_post(retrier, [dead, waiting], confirmed=False)
    assert confirm.status_code == 200
    assert confirm.context["jobs"] == [  # newest first, as listed
        {"queue": "failed", "id": "fp-1", "state": "dead"},
        {"queue": "awaiting", "id": "aw", "state": "awaiting_children"},
    ]
    assert snapshot(world.client) == before  # asking changes nothing
    done = action_post(retrier, [dead, waiting], confirmed=True)
    assert done.status_code == 302
    assert messages_of(done) == [
        "Retried failed/fp-1: now pending; failed/fp back to awaiting_children.",
        (
            "Not retried: job 'aw' in queue 'awaiting' is awaiting_children; "
            "only a dead job can be retried."
        ),
    ]
    child, parent = world.get_job("failed", "fp-1"), world.get_job("failed", "fp")
    assert (child.state, child.attempts, parent.state) == ("pending", 0, "awaiting_children")
    assert world.dependencies("failed", "fp").failed == {}
    assert mirrored(queue="failed") == {
        ("failed", "fp"): "awaiting_children",
        ("failed", "fp-1"): "pending",
    }
    [entry] = LogEntry.objects.all()
    assert (entry.object_id, entry.action_flag, entry.change_message, entry.user) == (
        str(dead.pk),
        CHANGE,
        "Retried by id",
        retrier.user,
    )


def test_retry_form_confirms_then_retries_a_cross_queue_child(world, retrier):
    add(
        world, Flow("orders", "orders.fulfil", {}, job_id="xf", children=[leaf("payments", "xf-p")])
    )
    step(world, "payments", "xf-p", error="declined")
    Pump(["payments"], mq=world).sweep()
    assert world.get_job("orders", "xf").state == "dead"
    form = reverse("admin:echomq_django_mirroredjob_retry")
    assert retrier.get(form, {"queue": "payments", "job_id": "xf-p"}).context["form"].initial == {
        "queue": "payments",
        "job_id": "xf-p",
    }
    ask = retrier.post(form, {"queue": "payments", "job_id": "xf-p"})
    assert ask.status_code == 200
    assert ask.context["jobs"] == [{"queue": "payments", "id": "xf-p", "state": "dead"}]
    assert world.get_job("payments", "xf-p").state == "dead"
    done = retrier.post(form, {"queue": "payments", "job_id": "xf-p", "confirm": "yes"})
    assert (done.status_code, done.url) == (302, job_url("payments", "xf-p"))
    assert messages_of(done) == [
        "Retried payments/xf-p: now pending; orders/xf back to awaiting_children."
    ]
    assert world.get_job("orders", "xf").state == "awaiting_children"
    assert mirrored(job_id__in=["xf", "xf-p"]) == {
        ("orders", "xf"): "awaiting_children",
        ("payments", "xf-p"): "pending",
    }
    entry = LogEntry.objects.get()
    assert entry.object_repr == "payments/xf-p" and entry.get_change_message() == "Retried by id"


def test_retry_form_reports_unknown_ids_and_jobs_that_are_not_dead(world, retrier):
    form = reverse("admin:echomq_django_mirroredjob_retry")
    unknown = retrier.post(
        form, {"queue": "failed", "job_id": "nope", "confirm": "yes"}, follow=True
    )
    assert unknown.redirect_chain == [(form, 302)]
    assert shown(unknown) == ["Not retried: job 'nope' not found in queue 'failed' (unknown id)."]
    alive = retrier.post(
        form, {"queue": "completed", "job_id": "done", "confirm": "yes"}, follow=True
    )
    assert shown(alive) == [
        (
            "Not retried: job 'done' in queue 'completed' is completed; "
            "only a dead job can be retried."
        )
    ]
    bad = retrier.post(form, {"queue": "no spaces", "job_id": "x"})
    assert bad.status_code == 200 and bad.context["form"].errors["queue"] == [
        "invalid queue name 'no spaces': a queue name is 1-64 characters from A-Z a-z 0-9 _ . -"
    ]
    assert LogEntry.objects.count() == 0
    assert world.get_job("completed", "done").state == "completed"
