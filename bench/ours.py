"""echomq_django's side of a run: build the ``Flow``, add it, start the
``Worker`` (and ``Pump``) processes, check what the root received."""

from __future__ import annotations

from echomq_django.core.jobs import to_text
from echomq_django.core.rows import STATE_FIELDS, row_state

from . import procs
from .topologies import CHILD_QUEUE, QUEUE, Spec, Topology, handler_value


class Ours:
    name = "echomq"

    def __init__(
        self,
        url: str,
        layout,
        *,
        poll_interval: float | None,
        pump_interval: float,
        profile: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.url, self.layout, self.profile = url, layout, profile
        self.poll_interval, self.pump_interval = poll_interval, pump_interval
        self.cluster = cluster  # url is a node of a Redis Cluster: rows say "cluster"
        self.name = "cluster" if cluster else "echomq"
        self.mq = procs._mq(url, cluster)
        self.version = _version("echomq-django")

    def describe_layout(self, topo: Topology) -> str:
        text = (
            f"{self.layout.procs} Worker process(es) x concurrency {self.layout.concurrency}"
            f" on {', '.join(topo.queues)}"
        )
        if topo.kind == "cross":
            text += f"; 1 Pump process (interval {self.pump_interval:g} s)"
        return text

    # -- the flow ------------------------------------------------------------
    def build(self, spec: Spec):
        from echomq_django import Flow

        return Flow(
            spec.queue, spec.name, spec.payload, children=[self.build(c) for c in spec.children]
        )

    def warm_up(self, topo: Topology) -> None:
        """Scripts loaded, code paths warm: a small flow of the same shape."""
        client = self.mq.client
        for script in self.mq.scripts._scripts.values():
            client.script_load(script.script)
        small = Topology(topo.kind, 4, 2 if topo.kind == "tree" else 0)
        self._land(self.build(small.spec()))

    def _land(self, flow):
        return self.mq.add_flow(flow)

    def add(self, flow):
        return self._land(flow)

    def fresh_connection(self) -> None:
        """Reconnect the adder, so the memory snapshot before the add sees no
        buffers left over from the warm-up (the change in client buffers
        across the add is then the add's own, and is subtracted)."""
        client = self.mq.client
        if self.cluster:
            for node in client.get_nodes():
                if node.redis_connection is not None:
                    node.redis_connection.connection_pool.disconnect()
        else:
            client.connection_pool.disconnect()
        client.ping()

    def root(self, ref) -> tuple[str, str]:
        return ref.queue, ref.parent_id

    def done_probe(self, pipe, ref) -> None:
        pipe.hmget(self.mq.keys.job(ref.queue, ref.parent_id), *STATE_FIELDS)

    @staticmethod
    def done_state(reply) -> str | None:
        """'completed' / 'dead' when the root is finished, else None."""
        state = to_text(row_state(reply))
        return state if state in ("completed", "dead") else None

    def progress_probe(self, pipe, topo: Topology) -> None:
        for q in topo.queues:
            pipe.zcard(self.mq.keys.queue_key(q, "completed"))

    # -- processes -------------------------------------------------------------
    def processes(self, ctx, topo: Topology, ready, go, stop, results) -> list:
        out = []
        options = {} if self.poll_interval is None else {"block_timeout": self.poll_interval}
        for _ in range(self.layout.procs):
            out.append(
                ctx.Process(
                    target=procs.our_worker,
                    daemon=True,
                    args=(
                        self.url,
                        topo.queues,
                        self.layout.concurrency,
                        options,
                        self.profile,
                        ready,
                        go,
                        stop,
                        results,
                        self.cluster,
                    ),
                )
            )
        if topo.kind == "cross":
            out.append(
                ctx.Process(
                    target=procs.our_pump,
                    daemon=True,
                    args=(
                        self.url,
                        [CHILD_QUEUE, QUEUE],
                        self.pump_interval,
                        self.profile,
                        ready,
                        go,
                        stop,
                        results,
                        self.cluster,
                    ),
                )
            )
        return out

    # -- the check ---------------------------------------------------------------
    def check(self, ref, spec: Spec) -> dict:
        """Every parent received exactly its children's values; the root completed."""
        ids = dict(zip(map(id, spec.walk()), ref.nodes, strict=False))
        bad, checked = [], 0
        for parent in spec.parents():
            q, pid = ids[id(parent)]
            expected = {ids[id(c)]: handler_value(c.name, c.payload) for c in parent.children}
            got = self.mq.children_values(q, pid)
            checked += len(got)
            if got != expected:
                missing = len(set(expected) - set(got))
                wrong = sum(1 for k, v in got.items() if expected.get(k, object()) != v)
                bad.append(f"{q}/{pid}: {missing} missing, {wrong} wrong of {len(expected)}")
        root = self.mq.get_job(ref.queue, ref.parent_id)
        if root.state.value != "completed" or root.result != "done":
            bad.append(f"root is {root.state.value} with result {root.result!r}")
        return {"ok": not bad, "values": checked, "problems": bad}

    def times(self, ref) -> list[tuple[int | None, int | None]]:
        """``(started_at, finished_at)`` in ms of every node, root first."""
        pipe = self.mq.client.pipeline(transaction=False)
        for q, jid in ref.nodes:
            pipe.hmget(self.mq.keys.job(q, jid), "started_at", "finished_at")
        return [tuple(int(v) if v else None for v in pair) for pair in pipe.execute()]

    def close(self) -> None:
        self.mq.client.close()


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None
