"""The keyspace: every key builder, the ``{queue}`` hash tag (a queue's keys
on one slot), and name validation that refuses before anything is written."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from echomq_django import Flow
from echomq_django.core.keyspace import ID_RULE, PREFIX_RULE, QUEUE_RULE, Keyspace, validate_id
from tests.support.jobkit import leaf, node, snapshot

K = Keyspace("emq")
PARTS = (
    "dependencies",
    "children",
    "processed",
    "failed",
    "unsuccessful",
    "removed",
    "logs",
    "errors",
)
QUEUE_KEYS = (
    "pending",
    "active",
    "delayed",
    "awaiting",
    "completed",
    "dead",
    "events",
    "flow:outbox",
    "flow:deadletter",
    "pump:lock",
    "pump:unlocked",
    "lease:seq",
)

BAD_QUEUES = [
    pytest.param("a{b", id="open-brace"),
    pytest.param("a}b", id="close-brace"),
    pytest.param("a:b", id="colon"),
    pytest.param("a b", id="space"),
    pytest.param("x" * 65, id="65-chars"),
    pytest.param("", id="empty"),
    pytest.param("ordérs", id="non-ascii"),
    pytest.param(7, id="not-str"),
]
BAD_IDS = [
    pytest.param("a:b", id="colon"),
    pytest.param("a b", id="space"),
    pytest.param("a\tb", id="tab"),
    pytest.param("a\nb", id="newline"),
    pytest.param("{a", id="open-brace"),
    pytest.param("a}", id="close-brace"),
    pytest.param("", id="empty"),
    pytest.param("x" * 129, id="129-chars"),
    pytest.param(12, id="not-str"),
]


def test_every_key_builder() -> None:
    assert K.prefix == "emq"
    assert K.base("orders") == "emq:{orders}:"
    assert K.job("orders", "o42") == "emq:{orders}:job:o42"
    assert K.child_ref("validation", "c1") == "emq:{validation}:job:c1"
    for part in PARTS:
        assert K.job_part("orders", "o42", part) == f"emq:{{orders}}:job:o42:{part}"
    for name in QUEUE_KEYS:
        assert K.queue_key("orders", name) == f"emq:{{orders}}:{name}"
    assert Keyspace("p.x-1").job("q", "j") == "p.x-1:{q}:job:j"


def test_refs_parse_back() -> None:
    assert K.parse_ref("emq:{validation}:job:c1") == ("validation", "c1")
    assert K.parse_base_id("emq:{orders}:o42") == ("orders", "o42")
    for bad in ("other:{q}:job:x", "emq:{q}:x", "emq:q:job:x"):
        with pytest.raises(ValueError, match="not a job ref under prefix 'emq'"):
            K.parse_ref(bad)
    with pytest.raises(ValueError, match="not a job under prefix 'emq'"):
        K.parse_base_id("emq:orders:o42")


def test_hash_tag_pins_every_key_of_a_queue_to_one_slot() -> None:
    keys = [
        K.job("orders", "o1"),
        K.job("orders", "other"),
        *(K.job_part("orders", "o1", p) for p in PARTS),
        *(K.queue_key("orders", n) for n in QUEUE_KEYS),
    ]
    assert {key_slot(k.encode()) for k in keys} == {key_slot(b"orders")}
    assert (
        key_slot(K.job("payments", "o1").encode()) == key_slot(b"payments") != key_slot(b"orders")
    )


def test_cluster_agrees_on_the_slot(rc) -> None:
    for queue in ("orders", "payments", "q.1-x_y"):
        slot = rc.execute_command("CLUSTER KEYSLOT", K.job_part(queue, "j1", "processed"))
        assert slot == key_slot(queue.encode())


def test_longest_names_are_valid() -> None:
    assert K.job("x" * 64, "y" * 128) == f"emq:{{{'x' * 64}}}:job:{'y' * 128}"
    assert validate_id("ä-ö.1_2") == "ä-ö.1_2"


@pytest.mark.parametrize("queue", BAD_QUEUES)
def test_bad_queue_name_raises_naming_the_rule(queue) -> None:
    for build in (
        lambda: K.base(queue),
        lambda: K.job(queue, "j"),
        lambda: K.queue_key(queue, "pending"),
    ):
        with pytest.raises(ValueError) as exc:
            build()
        assert str(exc.value) == f"invalid queue name {queue!r}: {QUEUE_RULE}"
    assert QUEUE_RULE == "a queue name is 1-64 characters from A-Z a-z 0-9 _ . -"


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_bad_job_id_raises_naming_the_rule(job_id) -> None:
    with pytest.raises(ValueError) as exc:
        K.job("orders", job_id)
    assert str(exc.value) == f"invalid job id {job_id!r}: {ID_RULE}"
    assert ID_RULE == (
        "a job id is 1-128 characters with no '{', '}', ':', whitespace, control or "
        "format characters (NUL, ESC, bidi overrides, zero-width...) or lone surrogates"
    )


@pytest.mark.parametrize("prefix", ["", "a:b", "{p}", "x" * 33])
def test_bad_prefix_raises_naming_the_rule(prefix) -> None:
    with pytest.raises(ValueError, match=f"invalid key prefix .*: {PREFIX_RULE}"):
        Keyspace(prefix)


@pytest.fixture
def seeded(mq):
    """A non-empty keyspace, so 'nothing written' compares real content."""
    mq.enqueue("orders", "seed", {"n": 1}, job_id="seed")
    return snapshot(mq.client)


@pytest.mark.parametrize("queue", BAD_QUEUES)
def test_bad_queue_writes_nothing(mq, seeded, queue) -> None:
    with pytest.raises(ValueError, match="invalid queue name"):
        mq.enqueue(queue, "n", {}, job_id="j1")
    with pytest.raises(ValueError, match="invalid queue name"):
        mq.add_flow(node("p", [leaf("c1"), Flow(queue, "leaf", job_id="c2")], queue="orders"))
    with pytest.raises(ValueError, match="invalid queue name"):
        mq.add_flow(Flow(queue, "root", children=[leaf("c1", queue="orders")]))
    assert snapshot(mq.client) == seeded


@pytest.mark.parametrize("job_id", BAD_IDS)
def test_bad_id_writes_nothing(mq, seeded, job_id) -> None:
    with pytest.raises(ValueError, match="invalid job id"):
        mq.enqueue("orders", "n", {}, job_id=job_id)
    deep = node(
        "p",
        [
            leaf("c1", queue="orders"),
            node(
                "mid",
                [leaf("ok", queue="orders"), Flow("orders", "leaf", job_id=job_id)],
                queue="orders",
            ),
        ],
        queue="orders",
    )
    with pytest.raises(ValueError, match="invalid job id"):
        mq.add_flow(deep)
    with pytest.raises(ValueError, match="invalid job id"):
        mq.add_flows(
            [
                node("fine", [leaf("f1", queue="orders")], queue="orders"),
                Flow("orders", "root", job_id=job_id),
            ]
        )
    assert snapshot(mq.client) == seeded


def test_bad_names_refused_by_reads_too(mq) -> None:
    with pytest.raises(ValueError, match="invalid queue name 'a:b'"):
        mq.get_job("a:b", "j")
    with pytest.raises(ValueError, match="invalid job id 'a b'"):
        mq.dependencies("orders", "a b")
    with pytest.raises(ValueError, match="invalid job id ''"):
        mq.retry("orders", "")


# -- each key named once, in the keyspace -----------------------------------------


def test_every_suffix_a_script_spells_is_named_in_the_keyspace():
    """Each ``base .. '<suffix>'`` and ``row .. ':<part>'`` in ``lua/`` is one
    of keyspace.py's names: the Lua and the Python speak one vocabulary."""
    import re
    from pathlib import Path

    from echomq_django.core import keyspace

    known = set(keyspace.QUEUE_KEYS.values()) | {
        keyspace.JOB_PREFIX,
        keyspace.CLAIM_PREFIX,
        keyspace.DEDUP_PREFIX,
        keyspace.OP_PREFIX,
        keyspace.GC_PREFIX,
        keyspace.DONE_PREFIX,
        keyspace.GROUP_PREFIX,
    }
    parts = set(keyspace.JOB_KEYS.values())
    lua = Path(__file__).resolve().parent.parent / "lua"
    spelled, spelled_parts = set(), set()
    for path in sorted(lua.rglob("*.lua")):
        code = "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())
        spelled |= set(re.findall(r"\bbase \.\. '([^']+)'", code))
        spelled_parts |= set(re.findall(r"\.\. '(:[a-z_]+)'", code))
    assert spelled and spelled_parts  # the patterns still match how the scripts read
    assert spelled - known == set()
    assert spelled_parts - parts == set()


def test_queue_keys_are_named_once_and_cached_with_a_bound():
    from echomq_django.core import keyspace

    ks = Keyspace("emq")
    assert ks.queue("q").outbox_tries == "emq:{q}:flow:tries"
    assert ks.queue("q").pump_lock == "emq:{q}:pump:lock"
    assert ks.queue("q").claim("t1") == "emq:{q}:claim:t1"
    assert ks.queue("q") is ks.queue("q")
    assert ks.job_keys("q", "j").processed == "emq:{q}:job:j:processed"
    for i in range(keyspace.QUEUES_KEPT + 5):
        ks.queue(f"q{i}")
    assert len(ks._queues) <= keyspace.QUEUES_KEPT
    with pytest.raises(ValueError, match="unknown queue key 'nope'"):
        ks.queue_key("q", "nope")
    with pytest.raises(ValueError, match="unknown job key 'nope'"):
        ks.job_part("q", "j", "nope")
    with pytest.raises(ValueError, match="invalid queue name"):
        ks.queue("a b")


# -- control and format characters are refused before any write ----------------


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


def test_enqueue_refuses_a_name_with_a_lone_surrogate_naming_the_rule(mq):
    with pytest.raises(ValueError, match=r"invalid job name .* U\+D800 \(a lone surrogate\)"):
        mq.enqueue("q", "send\ud800", {})
    assert mq.client.keys("*") == []
