"""The script loader: every Lua header declares
its contract, the Python side calls each script exactly as declared, the
scripts are found from the checkout, and NOSCRIPT falls back on both rigs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from redis.cluster import RedisCluster

from echomq_django import EchoMQ, Flow, JobState
from echomq_django.protocol.scripts import Scripts, load_sources, lua_dir, parse_header
from echomq_django.runners.dispatcher import Dispatcher
from echomq_django.runners.pump import Pump
from tests.support.jobkit import assert_state, claim_one, leaf, node

REPO = Path(__file__).resolve().parent.parent
LUA = sorted((REPO / "lua").glob("*.lua"))
NAMES = [p.stem for p in LUA]


def declared(text: str) -> dict:
    """An independent reading of a header (not scripts.parse_header): the
    KEYS / fixed ARGV indexes, the first variadic ARGV index, its group size."""
    header = text[: text.index("]]")]
    keys = [int(n) for n in re.findall(r"^\s+KEYS\[(\d+)\]\s+\S", header, re.MULTILINE)]
    argv = [int(n) for n in re.findall(r"^\s+ARGV\[(\d+)\]\s+\S", header, re.MULTILINE)]
    var = re.search(r"^\s+ARGV\[(\d+)\.\.\]", header, re.MULTILINE)
    group = re.search(r"(\d+) values each", header)
    return {
        "keys": keys,
        "argv": argv,
        "variadic": int(var.group(1)) if var else None,
        "group": int(group.group(1)) if group else 1,
        "header": header,
    }


@pytest.mark.parametrize("path", LUA, ids=NAMES)
def test_header_declares_purpose_keys_argv_returns_errors(path: Path) -> None:
    text = path.read_text()
    assert text.startswith(f"--[[\n  {path.stem}: "), "opens with '<name>: <purpose>'"
    d = declared(text)
    assert d["keys"] == list(range(1, len(d["keys"]) + 1)) and d["keys"], "KEYS[1..n] in order"
    assert d["argv"] == list(range(1, len(d["argv"]) + 1)) and d["argv"], "ARGV[1..n] in order"
    if d["variadic"] is not None:
        assert d["variadic"] == len(d["argv"]) + 1, "ARGV[n..] follows the fixed ARGV"
    assert re.search(r"^  returns: \S", d["header"], re.MULTILINE)
    assert re.search(r"^  errors: +\S", d["header"], re.MULTILINE)
    body = text[text.index("]]") + 2 :]
    # the body never reads past what the header declares
    assert max(map(int, re.findall(r"KEYS\[(\d+)\]", body)), default=0) <= len(d["keys"])
    if d["variadic"] is None:
        assert max(map(int, re.findall(r"ARGV\[(\d+)\]", body)), default=0) <= len(d["argv"])
    else:
        assert "#ARGV" in body, "the body walks the ARGV[n..] groups"
    # Valkey 8's Lua refuses a '[[' inside a '--[[' comment ("nesting of
    # [[...]] is deprecated") where Redis 7's accepts it
    assert "[[" not in d["header"][4:], "no '[[' inside the header comment"
    src = load_sources()[path.stem]  # the registry reads the same contract
    assert (src.nkeys, src.nargv, src.variadic) == (
        len(d["keys"]),
        len(d["argv"]),
        d["variadic"] is not None,
    )


def test_lib_is_inlined_not_a_script() -> None:
    sources = load_sources()
    assert sorted(sources) == NAMES
    flow = (REPO / "lua" / "lib" / "flow.lua").read_text()
    claimable = (REPO / "lua" / "lib" / "claimable.lua").read_text()
    groups = (REPO / "lua" / "lib" / "groups.lua").read_text()
    claimable = claimable.replace("-- @include lib/groups.lua\n", groups + "\n")
    # lib/pending.lua includes lib/row.lua: inlined there unless a script did before
    pending = (REPO / "lua" / "lib" / "pending.lua").read_text()
    row = (REPO / "lua" / "lib" / "row.lua").read_text()
    claimable, with_row = (
        claimable.replace(
            "-- @include lib/pending.lua", pending.replace("-- @include lib/row.lua", r)
        )
        for r in ("", row)
    )
    events = (REPO / "lua" / "lib" / "signal_events.lua").read_text()
    emit = (REPO / "lua" / "lib" / "emit.lua").read_text()
    error = (REPO / "lua" / "lib" / "error.lua").read_text()
    cancel_out = (REPO / "lua" / "lib" / "cancel_out.lua").read_text()
    flow = flow.replace("-- @include lib/row.lua\n", row + "\n")
    flow = flow.replace("-- @include lib/signal_events.lua\n", events + "\n")
    # lib/emit.lua includes lib/row.lua, already inlined above it: the line goes
    flow = flow.replace(
        "-- @include lib/emit.lua\n", emit.replace("-- @include lib/row.lua", "") + "\n"
    )
    flow = flow.replace("-- @include lib/error.lua\n", error + "\n")
    flow = flow.replace("-- @include lib/cancel_out.lua\n", cancel_out + "\n")
    flow_head, flow_tail = flow.split("-- @include lib/claimable.lua")
    for name, src in sources.items():
        assert "-- @include" not in src.text
        raw = (REPO / "lua" / f"{name}.lua").read_text()
        uses_flow = "-- @include lib/flow.lua" in raw
        assert (flow_head + claimable + flow_tail in src.text) is uses_flow, name
        # lib/claimable.lua (the one road to claimable) is inlined once, directly or
        # through lib/flow.lua
        uses_claimable = uses_flow or "-- @include lib/claimable.lua" in raw
        assert src.text.count(claimable) + src.text.count(with_row) == int(uses_claimable), name
        # lib/signal_events.lua (durable signal events) comes with lib/flow.lua, once
        assert src.text.count("local function signal_event(") == int(uses_flow), name
        # lib/row.lua (the row's short field names) is inlined once wherever a
        # script reads or writes them
        assert src.text.count("local function row_hmget(") <= 1, name


def test_lua_dir_is_the_checkout() -> None:
    assert lua_dir() == REPO / "lua"
    assert sorted(p.stem for p in lua_dir().glob("*.lua")) == NAMES


@pytest.mark.parametrize(
    "raw, problem",
    [
        ("local x = 1", "must open with a --[[ header ]]"),
        (
            "--[[\n  x: y\n  KEYS[2] a\n  returns: 1\n  errors: none\n]]",
            "header numbers its KEYS out of order",
        ),
        ("--[[\n  x: y\n  KEYS[1] a\n  errors: none\n]]", "header lacks a 'returns:' line"),
        ("--[[\n  x: y\n  KEYS[1] a\n  returns: 1\n]]", "header lacks a 'errors:' line"),
    ],
    ids=["no-header", "keys-out-of-order", "no-returns", "no-errors"],
)
def test_parse_header_refuses_a_bad_header(raw: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"lua/x.lua {problem}")):
        parse_header("x", raw)


def test_registry_refuses_a_call_that_breaks_the_header(mq) -> None:
    with pytest.raises(TypeError, match="script claim takes 4 KEYS and 12 ARGV, got 2 and 5"):
        mq.scripts.run("claim", ["a", "b"], [1, 2, 3, 4, 5])
    with pytest.raises(TypeError, match=r"script deliver_to_parents takes 2 KEYS and 3\+ ARGV"):
        mq.scripts.run_many([("deliver_to_parents", ["a", "b"], [1, 2])])


def drive_every_operation(mq, clock) -> None:
    """Run every script at least once through the public Python API."""
    mq.enqueue("q", "single", {"n": 1}, job_id="s1", max_attempts=2, backoff_ms=10)
    mq.enqueue("q", "later", None, job_id="s2", delay_ms=50)
    job = claim_one(mq, "q", "s1")
    mq.extend_lease(job, 1000)
    job.report_progress(50)  # write_reports (a job outside a worker: at once)
    job.log("half way")  # write_reports again
    mq.probes.minute_counts(["q"], 48, per=24)  # sum_minutes
    assert mq.fail(job, "once") is JobState.DELAYED
    clock.advance(100)
    assert mq.timers.promote_delayed("q") == 2
    assert len(mq.claim("q", 2, lease_ms=10)) == 2
    clock.advance(20)
    assert mq.timers.recover_stalled("q", max_stalls=0).dead == [("q", "s1"), ("q", "s2")]
    mq.retry("q", "s1")
    mq.complete_many([(claim_one(mq, "q", "s1"), {"ok": 1})])
    assert mq.wait("q", "s1", 0).result == {"ok": 1}  # wait_mark
    mq.add_flow(node("p", [leaf("c1"), leaf("x1", queue="other")]))
    mq.add_flows([node("p2", [leaf("c2")]), node("p3", [leaf("c3")])])
    for queue in ("q", "q", "q", "other"):
        mq.complete(claim_one(mq, queue), "done")
    Pump(["other"], mq=mq).sweep()  # deliver_to_parents on {q}, trim_outbox on {other}
    assert_state(mq, "q", "p", "pending")
    mq.cancel("q", "p")
    mq.remove("q", "p")  # then prune goes on with its subtree
    mq.signal_events.subscribe(["q"], ["completed"])
    mq.enqueue("q", "signalled", None, job_id="s9")
    jobs = mq.claim("q", 10)
    mq.complete_many([(job, "done") for job in jobs])
    assert Dispatcher(["q"], mq=mq).dispatch("q").sent == len(jobs) > 0  # ack_signals
    # pause, flow control, the children timeout, postpone, schedule marks
    mq.pause("q")
    mq.resume("q")
    mq.groups.pause("q", "tenant")  # set_group
    mq.add_flow(node("f", [leaf("f1"), leaf("f2")], children_timeout_ms=10))
    mq.remove_child_dependency("q", "f", mq.keys.job("q", "f1"))
    mq.remove_unprocessed_children("q", "f")
    mq.add_flow(node("g", [leaf("g1")], children_timeout_ms=10))
    clock.advance(10)
    assert mq.timers.expire_children("q")[0] == 1
    mq.enqueue("q", "later", None, job_id="s3")
    mq.timers.postpone(mq.claim("q", 1)[0], 5)
    # a step job: update_payload, add_children, wait_children
    mq.enqueue("steps", "stepper", {"step": 1}, job_id="st")
    step = claim_one(mq, "steps", "st")
    step.update_payload({"step": 2})
    step.log("step 2")
    assert mq.job_logs("steps", "st") == ["step 2"]  # job_logs; outside a worker, written now
    step.add_children([leaf("st1", queue="stepkids")])
    assert mq.flows.wait_for_children(step) is JobState.AWAITING_CHILDREN
    mq.timers.advance_schedule("q", "tick", 1, "init")
    assert len(mq.enqueue_many("bulk", [("n", 1), ("n", 2, {"delay_ms": 5})])) == 2
    # a child its parent on another slot ignored, retried: reattach_ignored
    mq.add_flow(node("h", [leaf("h1", queue="other", ignore_dependency_on_failure=True)]))
    mq.fail(claim_one(mq, "other", "h1"), "boom", dead=True)
    mq.retry("other", "h1")


@pytest.mark.via_flow_outbox
def test_python_calls_every_script_as_its_header_declares(tmq, clock, monkeypatch) -> None:
    calls = []
    original = Scripts.check_call

    def record(self, name, keys, args):
        calls.append((name, len(keys), len(args)))
        return original(self, name, keys, args)

    monkeypatch.setattr(Scripts, "check_call", record)
    drive_every_operation(tmq, clock)
    assert sorted({name for name, _, _ in calls}) == NAMES, "every script was exercised"
    for path in LUA:
        d = declared(path.read_text())
        for name, nkeys, nargs in calls:
            if name != path.stem:
                continue
            assert nkeys == len(d["keys"]), (name, nkeys)
            if d["variadic"] is None:
                assert nargs == len(d["argv"]), (name, nargs)
            else:
                extra = nargs - len(d["argv"])
                assert extra > 0 and extra % d["group"] == 0, (name, nargs, d["group"])


def nodes(client) -> list:
    """One target per master: a Cluster's primaries, or the single server."""
    if isinstance(client, RedisCluster):
        return [{"target_nodes": n} for n in client.get_primaries()]
    return [{}]


def flush_scripts(client, sha: str) -> None:
    """SCRIPT FLUSH on every master, and prove ``sha`` is gone everywhere."""
    for target in nodes(client):
        client.execute_command("SCRIPT FLUSH", **target)
        assert client.execute_command("SCRIPT EXISTS", sha, **target) in ([0], [False])


def test_noscript_fallback_run(mq) -> None:
    mq.enqueue("q", "n", 1, job_id="a")
    flush_scripts(mq.client, mq.scripts._scripts["enqueue"].sha)
    mq.enqueue("q", "n", 2, job_id="b")
    assert [j.id for j in mq.claim("q", 5)] == ["a", "b"]
    assert_state(mq, "q", "b", "active")


def test_noscript_fallback_run_many(mq) -> None:
    for queue in ("q", "other", "third"):  # three slots: three masters on the Cluster
        mq.enqueue(queue, "n", None, job_id="a")
        mq.enqueue(queue, "n", None, job_id="b")
    jobs = [j for queue in ("q", "other", "third") for j in mq.claim(queue, 2)]
    mq.complete_many([(jobs[0], 0)])  # the cluster path loads its SHAs once, here
    flush_scripts(mq.client, mq.scripts._scripts["complete"].sha)
    outcomes = mq.complete_many([(j, i) for i, j in enumerate(jobs[1:], 1)])
    assert [o.state for o in outcomes] == [JobState.COMPLETED] * 5
    for i, j in enumerate(jobs):
        assert assert_state(mq, j.queue, j.id, "completed")["result"] == str(i)


# -- pipelined script calls on a Cluster ---------------------------------------


def test_cluster_pipelines_route_on_the_host_without_command_getkeys(rc, monkeypatch):
    """Counted on this client (its parser's ``COMMAND GETKEYS``), not on the
    servers, which count any process's: a blocking ``XREAD`` asks it too."""
    mq = EchoMQ(rc, prefix="emq")
    flows = [Flow(f"q{i}", "parent", {}, children=[Flow(f"q{i}", "child", {})]) for i in range(6)]
    mq.add_flows(flows[:1])  # scripts loaded, connections made
    asked, real = [], rc.commands_parser._get_moveable_keys
    monkeypatch.setattr(
        rc.commands_parser, "_get_moveable_keys", lambda *a: asked.append(a[1:]) or real(*a)
    )
    refs = mq.add_flows(flows[1:])  # six queues over three masters, one pipeline
    assert [r.landed for r in refs] == [2] * 5
    assert asked == []
    rc.xread({"emq:{q1}:x": "0-0"}, count=1)  # the count sees one when there is one
    assert [a[0] for a in asked] == ["XREAD"]
