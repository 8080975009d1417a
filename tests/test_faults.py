"""Faults found by testing (issue 17), the quick ones: routing on a Cluster,
transient errors, replays, the retry of an ignored child, bad input."""

from __future__ import annotations

import pytest
import redis

from echomq_django import EchoMQ, Flow, JobNotActive, JobNotRetryable, JobState
from echomq_django.core.exceptions import RedisUnavailable
from echomq_django.runners.pump import Pump
from tests.support import rigs


def _getkeys_calls(cluster: rigs.Cluster) -> int:
    total = 0
    for port in cluster.ports:
        node = redis.Redis(host=rigs.HOST, port=port)
        try:
            stats = node.info("commandstats")
        finally:
            node.close()
        total += stats.get("cmdstat_command|getkeys", {}).get("calls", 0)
    return total


def test_cluster_pipelines_route_on_the_host_without_command_getkeys(redis_cluster, rc):
    mq = EchoMQ(rc, prefix="emq")
    flows = [Flow(f"q{i}", "parent", {}, children=[Flow(f"q{i}", "child", {})]) for i in range(6)]
    mq.add_flows(flows[:1])  # scripts loaded, connections made
    before = _getkeys_calls(redis_cluster)
    refs = mq.add_flows(flows[1:])  # six queues over three masters, one pipeline
    assert [r.landed for r in refs] == [2] * 5
    assert _getkeys_calls(redis_cluster) == before


# -- item 4: replays are recognised by the call, not by equal timestamps ------


def test_fail_on_a_job_this_lease_completed_is_refused(mq):
    mq.enqueue("q", "x", {}, job_id="j")
    [job] = mq.claim("q", 1)
    mq.complete(job, {"ok": 1})
    with pytest.raises(JobNotActive, match="is completed"):
        mq.fail(job, "boom")
    assert mq.get_job("q", "j").state is JobState.COMPLETED


def test_only_the_same_fail_is_a_replay(mq):
    mq.enqueue("q", "x", {}, job_id="j", max_attempts=3, backoff_ms=1000)
    [job] = mq.claim("q", 1)
    assert mq.fail(job, "boom") is JobState.DELAYED
    assert mq.fail(job, "boom") is JobState.DELAYED  # the same call again: a no-op
    with pytest.raises(JobNotActive, match="is delayed"):
        mq.fail(job, "another error")  # not a replay of that call
    assert mq.get_job("q", "j").attempts == 1


# -- item 5: retrying a dead child its parent ignored --------------------------


def _ignoring_parent(mq, child_queue: str) -> None:
    mq.add_flow(
        Flow(
            "p",
            "parent",
            {},
            job_id="P",
            children=[
                Flow(child_queue, "child", {}, job_id="A", ignore_dependency_on_failure=True),
                Flow("p", "child", {}, job_id="B"),
            ],
        )
    )


def _finish(mq, queue: str, job_id: str, result=None, dead=False):
    """Claim the next job of ``queue`` (it must be ``job_id``) and finish it."""
    [job] = mq.claim(queue, 1)
    assert job.id == job_id
    return mq.fail(job, "boom", dead=True) if dead else mq.complete(job, result)


@pytest.mark.parametrize("child_queue", ["p", "c"], ids=["same-queue", "cross-queue"])
def test_retry_of_an_ignored_child_reattaches_while_the_parent_waits(mq, child_queue):
    _ignoring_parent(mq, child_queue)
    _finish(mq, child_queue, "A", dead=True)
    Pump([child_queue], mq=mq).sweep()
    ref = mq.keys.child_ref(child_queue, "A")
    assert mq.ignored_failures("p", "P") == {ref: "boom"}
    assert mq.dependency_counts("p", "P")["remaining"] == 1  # B still runs
    mq.retry(child_queue, "A")
    Pump([child_queue], mq=mq).sweep()
    assert mq.ignored_failures("p", "P") == {}
    assert mq.dependency_counts("p", "P")["remaining"] == 2  # A counts again
    _finish(mq, "p", "B", 2)
    assert mq.get_job("p", "P").state is JobState.AWAITING_CHILDREN  # waits for A
    _finish(mq, child_queue, "A", 1)
    Pump([child_queue], mq=mq).sweep()
    assert mq.get_job("p", "P").state is JobState.PENDING
    assert mq.children_values("p", "P") == {ref: 1, mq.keys.child_ref("p", "B"): 2}
    assert mq.dependency_counts("p", "P")["remaining"] == 0


def test_retry_of_an_ignored_child_is_refused_once_the_parent_went_on(mq):
    _ignoring_parent(mq, "p")
    a, b = mq.claim("p", 2)
    mq.complete(b, 2)
    mq.fail(a, "boom", dead=True)  # the parent is released without it
    assert mq.get_job("p", "P").state is JobState.PENDING
    with pytest.raises(JobNotRetryable, match="parent p/P ignored its death and is pending"):
        mq.retry("p", "A")
    assert mq.get_job("p", "A").state is JobState.DEAD  # nothing written
    assert mq.ignored_failures("p", "P") == {mq.keys.child_ref("p", "A"): "boom"}


# -- item 7: bad input is refused before any write ------------------------------

BAD_TEXT = {
    "NUL": "a\x00b",
    "ESC": "a\x1b[31mb",
    "bidi override": "a\u202eb",
    "zero width": "a\u200bb",
    "lone surrogate": "a\ud800b",
}


@pytest.mark.parametrize("text", BAD_TEXT.values(), ids=BAD_TEXT.keys())
def test_ids_and_names_with_control_or_format_characters_are_refused(mq, text):
    with pytest.raises(ValueError, match="control or format characters"):
        mq.enqueue("q", "x", {}, job_id=text)
    with pytest.raises(ValueError, match="control or format characters"):
        mq.add_flow(Flow("q", "x", {}, job_id=text))
    with pytest.raises(ValueError, match="control or format characters"):
        mq.add_flow(Flow("q", "x", {}, children=[Flow("q", text, {})]))
    assert mq.client.keys("*") == []


def test_a_cross_queue_flow_with_a_bad_child_name_lands_nothing(mq):
    flow = Flow("p", "parent", {}, job_id="root", children=[Flow("c", "bad\ud800", {})])
    with pytest.raises(ValueError, match=r"it holds U\+D800 \(a lone surrogate\)"):
        mq.add_flow(flow)
    assert mq.client.keys("*") == []  # the root did not land, awaiting for ever


def test_unicode_letters_stay_valid_in_ids_and_names(mq):
    mq.enqueue("q", "envoyer.reçu", {}, job_id="commande-été-42")
    assert mq.get_job("q", "commande-été-42").name == "envoyer.reçu"


GOOD = {"URL": "redis://127.0.0.1:1/0", "QUEUES": {"orders": {"MAX_ATTEMPTS": 3}}}


def check_ids(cfg, deploy: bool = False) -> list[str]:
    from django.core.checks import run_checks
    from django.test import override_settings

    with override_settings(ECHOMQ=cfg):
        found = run_checks(databases=[], include_deployment_checks=deploy)
        return [m.id for m in found if m.id.startswith("echomq_django.")]


@pytest.mark.parametrize(
    "cfg, expected",
    [
        ({**GOOD, "QUEUES": {"orders": {"LEASE_MS": 0}}}, ["echomq_django.E011"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": "1000"}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": -1}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": 0}, ["echomq_django.E012"]),
        ({**GOOD, "MAX_PAYLOAD_BYTES": True}, ["echomq_django.E012"]),
        ({**GOOD, "OPTIONS": {"bogus": 1}}, ["echomq_django.E013"]),
        ({**GOOD, "OPTIONS": ["socket_timeout"]}, ["echomq_django.E013"]),
        ({**GOOD, "CLUSTER": "yes"}, ["echomq_django.E014"]),
        ({**GOOD, "OPTIONS": {"socket_timeout": 5}, "MAX_PAYLOAD_BYTES": 1000}, []),
        ({**GOOD, "CLUSTER": True, "OPTIONS": {"read_from_replicas": True}}, []),
    ],
)
def test_settings_that_would_misbehave_fail_the_check(no_env_url, cfg, expected):
    assert check_ids(cfg) == expected


def test_check_deploy_compares_cluster_with_the_server(no_env_url, redis_server, redis_cluster):
    single, node = redis_server, redis_cluster.url
    assert check_ids({"URL": single}, deploy=True) == []
    assert check_ids({"URL": single, "CLUSTER": True}, deploy=True) == ["echomq_django.E015"]
    assert check_ids({"URL": single, "CLUSTER": True}) == []  # plain check: no Redis I/O
    assert check_ids({"URL": node, "CLUSTER": True}, deploy=True) == []
    assert check_ids({"URL": node}, deploy=True) == ["echomq_django.E016"]
    assert check_ids({"URL": single.replace("/0", "/99")}, deploy=True) == ["echomq_django.E017"]
    from echomq_django import conf

    [(_, message, _)] = conf.server_problems({"URL": node})
    assert message == f"{node}: this is a Redis Cluster node: set CLUSTER"


def test_enqueue_refuses_a_name_with_a_lone_surrogate_naming_the_rule(mq):
    with pytest.raises(ValueError, match=r"invalid job name .* U\+D800 \(a lone surrogate\)"):
        mq.enqueue("q", "send\ud800", {})
    assert mq.client.keys("*") == []


# -- item 6: a poison outbox entry is dead-lettered, the pump goes on -----------

POISON = {
    "not json {": "malformed entry: not JSON (Expecting value: line 1 column 1 (char 0))",
    "[1, 2]": "malformed entry: a JSON list, not an object",
    '{"k": "done"}': "malformed entry: 'c' is None, not a string",
    '{"k": "zzz", "c": "x", "p": "P", "q": "p"}': (
        "malformed entry: kind 'zzz' is not one of "
        "('done', 'dead', 'reattach', 'gone', 'rm', 'cancel')"
    ),
    '{"k": "done", "c": "x", "p": "P", "q": "p", "v": {"a": 1}}': (
        "malformed entry: 'v' is {'a': 1}, not a string"
    ),
    '{"k": "done", "c": "x", "p": "a:b", "q": "p"}': "malformed entry: invalid job id 'a:b'",
}


def test_poison_outbox_entries_are_dead_lettered_with_the_real_reason(mq):
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    outbox = mq.keys.queue("c").outbox
    mq.client.rpush(outbox, *POISON)  # ahead of the real entry: they must not block it
    [job] = mq.claim("c", 1)
    mq.complete(job, 7)
    report = Pump(["c"], mq=mq).sweep()["c"]
    assert (report["delivered"], report["deadlettered"]) == (1, len(POISON))
    assert mq.get_job("p", "P").state is JobState.PENDING  # released by the real entry
    letters = mq.outbox.deadletters("c")
    assert [d["entry"] for d in letters][:2] == ["not json {", [1, 2]]
    for letter, (raw, reason) in zip(letters, POISON.items(), strict=True):
        assert letter["reason"].startswith(reason), raw
    assert mq.counts("c")["outbox"] == 0


def test_the_outbox_dead_letter_keeps_the_newest_1000(mq):
    """The bound of P:{q}:flow:deadletter: trim_outbox trims as it pushes,
    so a flood of poison entries keeps exactly the newest 1,000."""
    from echomq_django.protocol.outbox import OUTBOX_DEADLETTER_MAX

    assert OUTBOX_DEADLETTER_MAX == 1000
    k, n = mq.keys.queue("c"), OUTBOX_DEADLETTER_MAX + 5
    mq.client.rpush(k.outbox, *(f"poison {i:04d}" for i in range(n)))
    report = Pump(["c"], mq=mq).sweep()["c"]  # three trims: 500, 500, 5
    assert (report["delivered"], report["deadlettered"]) == (0, n)
    assert mq.client.llen(k.deadletter) == 1000
    letters = mq.outbox.deadletters("c")
    assert [d["entry"] for d in letters] == [f"poison {i:04d}" for i in range(5, n)]
    assert {d["reason"] for d in letters} == {
        "malformed entry: not JSON (Expecting value: line 1 column 1 (char 0))"
    }
    assert (mq.counts("c")["outbox"], mq.counts("c")["deadletter"]) == (0, 1000)

    mq.client.rpush(k.outbox, "poison last")  # one more, in a sweep of its own
    assert Pump(["c"], mq=mq).sweep()["c"]["deadlettered"] == 1
    assert mq.client.llen(k.deadletter) == 1000
    entries = [d["entry"] for d in mq.outbox.deadletters("c")]
    assert entries == [*(f"poison {i:04d}" for i in range(6, n)), "poison last"]


@pytest.mark.parametrize(
    "error",
    [
        redis.exceptions.ClusterError("TTL exhausted."),
        redis.exceptions.RedisClusterException("Redis Cluster cannot be connected."),
        redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"),
        redis.exceptions.ConnectionError("Connection refused"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_delivery_failing_for_a_transient_reason_leaves_the_outbox_untouched(mq, error):
    """A failover's refusal (of the batch, then of each entry) is "not now":
    no try counted, nothing dead-lettered, the entry delivered by the next sweep."""
    mq.add_flow(Flow("p", "parent", {}, job_id="P", children=[Flow("c", "child", {}, job_id="C")]))
    [job] = mq.claim("c", 1)
    mq.complete(job, 7)
    real, pump = mq.scripts.run_many_confirmed, Pump(["c"], mq=mq, max_tries=1)

    def failing(calls, after=None):
        raise error  # what redis-py raises inside mq.outbox.deliver

    mq.scripts.run_many_confirmed = failing
    for _ in range(3):
        with pytest.raises(RedisUnavailable):
            pump.sweep()
    assert mq.counts("c")["outbox"] == 1
    assert mq.outbox.deadletters("c") == []
    assert mq.client.hlen(mq.keys.queue("c").outbox_tries) == 0
    mq.scripts.run_many_confirmed = real
    assert pump.sweep()["c"]["delivered"] == 1
    assert mq.get_job("p", "P").state is JobState.PENDING


# -- items 2 and 7: command flags and server checks -------------------------------


def run_command(name: str, *args: str) -> tuple[int, str]:
    """``call_command(name, *args)``: (exit code, stderr), as the shell sees them."""
    import io

    from django.core.management import call_command
    from django.core.management.base import CommandError

    err = io.StringIO()
    try:
        call_command(name, *args, stderr=err)
    except CommandError as exc:
        return exc.returncode, str(exc)
    except SystemExit as exc:
        return exc.code, err.getvalue()
    return 0, err.getvalue()


@pytest.mark.parametrize(
    "args, message",
    [
        (("--interval", "0"), "interval must be a number of seconds > 0, got 0.0"),
        (("--batch", "0"), "batch must be a whole number >= 1, got 0"),
        (("--batch", "-1"), "batch must be a whole number >= 1, got -1"),
        (("--max-tries", "0"), "max_tries must be a whole number >= 1, got 0"),
        (("--lock-ms", "0"), "lock_ms must be a whole number >= 100 (ms), got 0"),
        (("--lock-ms", "-1"), "lock_ms must be a whole number >= 100 (ms), got -1"),
        (("--max-stalls", "-1"), "max_stalls must be a whole number >= 0, got -1"),
    ],
)
def test_runpump_refuses_a_flag_that_breaks_its_rule(r, db, args, message):
    assert run_command("runpump", "q", *args) == (1, f"runpump: {message}")


def test_runworker_refuses_max_jobs_below_one(r, db):
    code, err = run_command("runworker", "q", "--max-jobs", "-1")
    assert (code, err) == (1, "runworker: --max-jobs must be a whole number >= 1, got -1\n")


@pytest.mark.parametrize("command", ["runworker", "runpump"])
def test_the_commands_say_a_cluster_node_needs_cluster(command, redis_cluster, monkeypatch):
    from echomq_django import conf

    monkeypatch.setenv("ECHOMQ_URL", redis_cluster.url)
    conf.reset()
    try:
        code, err = run_command(command, "q", "--once" if command == "runpump" else "--burst")
    finally:
        conf.reset()
    assert code == 1
    assert err.startswith(
        f"{command}: {redis_cluster.url}: this is a Redis Cluster node: set CLUSTER"
    )


def test_a_db_index_out_of_range_is_reported_as_itself(redis_server, monkeypatch):
    from echomq_django import conf

    url = redis_server.replace("/0", "/99")
    monkeypatch.setenv("ECHOMQ_URL", url)
    conf.reset()
    try:
        code, err = run_command("runworker", "q", "--burst")
    finally:
        conf.reset()
    assert code == 1
    assert err.startswith(f"runworker: DB index is out of range: {url} selects db 99")
