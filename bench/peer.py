"""BullMQ's side of a run, through its Python client (``pip install bullmq``,
the ``bench`` extra): ``FlowProducer.add`` and ``Worker`` processes on the
same Redis server."""

from __future__ import annotations

import asyncio
import warnings

import redis

from . import procs
from .topologies import CHILD_QUEUE, QUEUE, Spec, Topology, handler_value


def available() -> str | None:
    """BullMQ's version when its Python client is importable, else None."""
    try:
        import bullmq  # noqa: F401
    except ImportError:
        return None
    from .ours import _version

    return _version("bullmq") or "unknown"


class Peer:
    name = "bullmq"

    def __init__(self, url: str, layout, *, profile: str | None = None) -> None:
        from bullmq import FlowProducer

        warnings.simplefilter("ignore")  # its eviction-policy / deprecation notes
        self.url, self.layout, self.profile = url, layout, profile
        self.loop = asyncio.new_event_loop()
        self.producer = FlowProducer({"connection": url})
        self.sync = redis.Redis.from_url(url)
        self.version = available()

    def describe_layout(self, topo: Topology) -> str:
        text = (
            f"{self.layout.procs} process(es), each a Worker on {QUEUE} with concurrency "
            f"{self.layout.concurrency}"
        )
        if topo.kind == "cross":
            text = (
                f"{self.layout.procs} process(es), each a Worker on {CHILD_QUEUE} with "
                f"concurrency {self.layout.concurrency} and one on {QUEUE} with "
                "concurrency 1"
            )
        return text

    def build(self, spec: Spec) -> dict:
        node = {"name": spec.name, "queueName": spec.queue, "data": spec.payload}
        if spec.children:
            node["children"] = [self.build(c) for c in spec.children]
        return node

    def warm_up(self, topo: Topology) -> None:
        from bullmq.redis_connection import SCRIPT_DEFINITIONS, loadScript

        for filename in SCRIPT_DEFINITIONS.values():
            self.sync.script_load(loadScript(filename))
        small = Topology(topo.kind, 4, 2 if topo.kind == "tree" else 0)
        self._land(self.build(small.spec()))

    def _land(self, flow: dict):
        return self.loop.run_until_complete(self.producer.add(flow))

    def add(self, flow: dict):
        return self._land(flow)

    def fresh_connection(self) -> None:
        """Reconnect the producer's connection (see ``Ours.fresh_connection``)."""
        conn = self.producer.backend.connection.conn

        async def reconnect():
            if conn.connection is not None:
                await conn.connection.disconnect()
            await conn.ping()

        self.loop.run_until_complete(reconnect())

    def root(self, tree) -> tuple[str, str]:
        return QUEUE, tree["job"].id

    def done_probe(self, pipe, tree) -> None:
        pipe.zscore(f"bull:{QUEUE}:completed", tree["job"].id)
        pipe.zscore(f"bull:{QUEUE}:failed", tree["job"].id)

    @staticmethod
    def done_state(completed, failed=None) -> str | None:
        if completed is not None:
            return "completed"
        return "dead" if failed is not None else None

    def progress_probe(self, pipe, topo: Topology) -> None:
        for q in topo.queues:
            pipe.zcard(f"bull:{q}:completed")

    def processes(self, ctx, topo: Topology, ready, go, stop, results) -> list:
        if topo.kind == "cross":
            queues = [(CHILD_QUEUE, self.layout.concurrency), (QUEUE, 1)]
        else:
            queues = [(QUEUE, self.layout.concurrency)]
        return [
            ctx.Process(
                target=procs.peer_worker,
                daemon=True,
                args=(self.url, queues, self.profile, ready, go, stop, results),
            )
            for _ in range(self.layout.procs)
        ]

    def check(self, tree, spec: Spec) -> dict:
        bad, checked = [], 0

        async def walk(node, s):
            nonlocal checked
            if not s.children:
                return
            job = node["job"]
            got = await job.getChildrenValues()
            expected = {
                f"bull:{c.queue}:{child['job'].id}": handler_value(c.name, c.payload)
                for child, c in zip(node["children"], s.children, strict=False)
            }
            checked += len(got)
            if got != expected:
                missing = len(set(expected) - set(got))
                wrong = sum(1 for k, v in got.items() if expected.get(k, object()) != v)
                bad.append(
                    f"{job.queue.name}/{job.id}: {missing} missing, {wrong} wrong of "
                    f"{len(expected)}"
                )
            for child, c in zip(node["children"], s.children, strict=False):
                await walk(child, c)

        self.loop.run_until_complete(walk(tree, spec))
        result = self.sync.hget(f"bull:{QUEUE}:{tree['job'].id}", "returnvalue")
        if result != b'"done"':
            bad.append(f"root returnvalue is {result!r}")
        return {"ok": not bad, "values": checked, "problems": bad}

    def times(self, tree) -> list[tuple[int | None, int | None]]:
        """``(processedOn, finishedOn)`` in ms of every node, root first."""
        keys, level = [], [tree]
        while level:
            keys += [f"bull:{n['job'].queue.name}:{n['job'].id}" for n in level]
            level = [c for n in level for c in n.get("children", [])]
        pipe = self.sync.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, "processedOn", "finishedOn")
        return [tuple(int(v) if v else None for v in pair) for pair in pipe.execute()]

    def close(self) -> None:
        try:
            self.loop.run_until_complete(self.producer.close())
        finally:
            self.loop.close()
            self.sync.close()
