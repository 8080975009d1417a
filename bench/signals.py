"""``python -m bench.signals``: what durable signals cost
(docs/explanation/performance.md#what-durable-signals-cost).

Resolves the wide 1+N flow (default N = 10,000) with our workers in pairs of
runs, one run with durable events off and one with them on, alternating
(off, on, off, on, ...) in one invocation on one private redis-server, so
both see the same machine. "On" records the event kinds ``--kinds`` names on
the flow's queue (default: what a site without a ``job_completed`` receiver
records under the cost rule; ``--kinds all``: every completion writes an
event too, the worst case) and runs a ``Dispatcher`` process beside the
workers, sending every event to a receiver that does nothing, while the flow
resolves. "Off" is a site without receivers: nothing is recorded.

Printed per pair: the resolve time and rate of each run and the ratio
on/off; then the median ratio, Redis commands and CPU per node, and how many
events the dispatcher had sent when the root completed (the rest are sent
right after; the run checks that every event was sent once the processes
stopped). ``--no-dispatcher`` records the events but sends none: the cost
of writing them alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from echomq_django.testing.redis_server import start_server

from . import procs
from .ours import Ours
from .runner import Layout, Probe, Progress, run_one
from .topologies import Topology

ALL = ["completed", "dead", "released", "flow_failed", "cancelled"]
TYPICAL = ["dead", "released", "flow_failed", "cancelled"]  # no job_completed receiver


def _event_mq(url: str):
    import redis

    from echomq_django import EchoMQ

    return EchoMQ(redis.Redis.from_url(url), prefix=procs.PREFIX)


def our_dispatcher(url, queues, kinds, ready, go, stop, results) -> None:
    """One process running a ``Dispatcher`` (a thread per queue) with a
    receiver that does nothing on the signal of each of ``kinds``."""
    procs.setup_django(url)
    from echomq_django import signals
    from echomq_django.protocol.signal_events import SIGNAL_OF
    from echomq_django.runners.dispatcher import Dispatcher

    def receiver(sender, **kwargs):
        return None

    for kind in kinds:
        getattr(signals, SIGNAL_OF[kind]).connect(receiver, weak=False)
    mq = _event_mq(url)
    dispatcher = Dispatcher(queues, mq=mq, batch=500, block_ms=200)
    mq.client.ping()
    ready.put(os.getpid())
    go.wait()
    cpu = time.process_time()
    dispatcher.start()
    stop.wait()
    sent_at_stop = dispatcher.sent
    dispatcher.stop()
    dispatcher.dispatch_all()  # whatever was left when the run stopped
    results.put(
        {
            "role": "dispatcher",
            "pid": os.getpid(),
            "cpu_s": time.process_time() - cpu,
            "sent_during_run": sent_at_stop,
            "sent": dispatcher.sent,
        }
    )


class OursWithSignals(Ours):
    """Our side with ``kinds`` recorded on the flow's queues, and
    (unless ``dispatcher`` is false) a dispatcher process sending them."""

    name = "echomq+signals"

    def __init__(self, *args, kinds: list[str], dispatcher: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.kinds, self.dispatcher, self.queues = kinds, dispatcher, []
        self.events = _event_mq(self.url)

    def processes(self, ctx, topo: Topology, ready, go, stop, results) -> list:
        self.queues = list(topo.queues)
        out = super().processes(ctx, topo, ready, go, stop, results)
        if self.dispatcher:
            out.append(
                ctx.Process(
                    target=our_dispatcher,
                    daemon=True,
                    args=(self.url, self.queues, self.kinds, ready, go, stop, results),
                )
            )
        return out

    def fresh_connection(self) -> None:
        super().fresh_connection()
        self.events.signal_events.subscribe(self.queues, self.kinds)  # after the warm-up's FLUSHALL

    def close(self) -> None:
        self.events.client.close()
        super().close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.signals", description=__doc__.split("\n")[0])
    p.add_argument("--children", type=int, default=10_000, help="N of wide 1+N (default 10000)")
    p.add_argument("--pairs", type=int, default=5, help="off/on pairs (default 5)")
    p.add_argument("--workers", default="2x50", help="PROCESSESxCONCURRENCY (default 2x50)")
    p.add_argument(
        "--no-dispatcher",
        dest="dispatcher",
        action="store_false",
        help="record the events but run no dispatcher: the cost of writing them alone",
    )
    p.add_argument(
        "--kinds",
        default="typical",
        help="event kinds recorded in the 'on' runs: 'typical' (dead, released, flow_failed, "
        "cancelled: a site without a job_completed receiver, the cost rule's default), 'all' "
        "(every completion writes an event too), or a comma-separated list (default typical)",
    )
    p.add_argument("--timeout", type=float, default=300, help="per run, s (default 300)")
    args = p.parse_args(argv)
    layout = Layout.parse(args.workers)
    kinds = {"typical": TYPICAL, "all": ALL}.get(args.kinds) or args.kinds.split(",")
    topo = Topology("wide", args.children, 0)
    server = start_server(hint="python -m bench.signals starts its own redis-server")
    try:
        probe, progress = Probe(server.url), Progress(None)
        off = Ours(server.url, layout, poll_interval=0.05, pump_interval=0.05)
        on = OursWithSignals(
            server.url,
            layout,
            poll_interval=0.05,
            pump_interval=0.05,
            kinds=kinds,
            dispatcher=args.dispatcher,
        )
        mode = "recorded and dispatched" if args.dispatcher else "recorded, not dispatched"
        print(
            f"wide 1+{args.children:,}, workers {layout}, events of {', '.join(kinds)} {mode}; "
            f"{args.pairs} pairs"
        )
        print("pair  off s   off nodes/s  on s    on nodes/s  on/off rate  sent by root/events")
        ratios, rows = [], []
        for i in range(args.pairs):
            a = run_one(off, topo, probe, progress, args.timeout)
            b = run_one(on, topo, probe, progress, args.timeout)
            if not (a["values_ok"] and b["values_ok"]):
                print("a run failed its values check:", a["problems"], b["problems"])
                return 1
            d = [s for s in b["processes"] if s["role"] == "dispatcher"]
            sent = f"{d[0]['sent_during_run']:,}/{d[0]['sent']:,}" if d else "-"
            expected = (topo.nodes if "completed" in kinds else 0) + ("released" in kinds)
            if d and d[0]["sent"] != expected:
                print(f"the dispatcher sent {d[0]['sent']} events, expected {expected}")
                return 1
            ratio = b["resolve_nodes_per_s"] / a["resolve_nodes_per_s"]
            ratios.append(ratio)
            rows.append((a, b, d))
            print(
                f"{i + 1:>4}  {a['resolve_s']:<6.3f}  {a['resolve_nodes_per_s']:>11,}  "
                f"{b['resolve_s']:<6.3f}  {b['resolve_nodes_per_s']:>10,}  {ratio:>11.3f}  {sent}"
            )
        a, b, d = rows[0]
        median = statistics.median(ratios)
        print(f"median on/off resolve rate: {median:.3f} (cost {100 * (1 - median):.1f}%)")
        cmds, cpu = a["redis_commands_per_node"], a["redis_cpu_us_per_node"]
        workers = sum(s["cpu_s"] for s in b["processes"] if s["role"] == "worker")
        line = (
            f"first pair, per node: Redis commands {cmds['resolve']} -> "
            f"{b['redis_commands_per_node']['resolve']}, Redis CPU {cpu['resolve']} -> "
            f"{b['redis_cpu_us_per_node']['resolve']} us, worker CPU "
            f"{a['worker_cpu_us_per_node']} -> {workers * 1e6 / topo.nodes:.1f} us"
        )
        if d:
            line += f", dispatcher CPU {d[0]['cpu_s'] * 1e6 / topo.nodes:.1f} us"
        print(line)
        off.close()
        on.close()
        probe.flush()
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
