"""The benchmark's topologies, described once for both
queues: a neutral tree that ``ours.py`` turns into ``echomq_django.Flow`` and
``peer.py`` into a BullMQ flow dict.

Every leaf and branch carries ``{"i": index}`` and its handler returns that
index; the root returns ``"done"``. So the expected value of every child is
known, and a run checks that each parent received exactly its children's
values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

QUEUE = "bench"  # the root's (and same-queue children's) queue
CHILD_QUEUE = "bench2"  # the children's queue in the cross-queue topology
ROOT, BRANCH, LEAF = "bench.root", "bench.branch", "bench.leaf"


@dataclass
class Spec:
    """A node: handler name, queue, payload, children."""

    name: str
    queue: str
    payload: dict
    children: list[Spec] = field(default_factory=list)

    def walk(self):
        """Every node, breadth first (the order flows are landed in)."""
        level = [self]
        while level:
            yield from level
            level = [c for n in level for c in n.children]

    def parents(self):
        return [n for n in self.walk() if n.children]


@dataclass(frozen=True)
class Topology:
    """``kind`` is ``wide`` (1 + n children), ``tree`` (1 -> branches ->
    n leaves, spread evenly) or ``cross`` (wide, children on a second queue)."""

    kind: str
    n: int
    branches: int = 0

    @property
    def key(self) -> str:
        if self.kind == "tree":
            return f"tree-1x{self.branches}x{self.n}"
        return f"{self.kind}-{self.n}"

    @property
    def label(self) -> str:
        if self.kind == "tree":
            return f"3-tier 1→{self.branches:,}→{self.n:,}"
        if self.kind == "cross":
            return f"cross-queue 1+{self.n:,}"
        return f"wide 1+{self.n:,}"

    @property
    def nodes(self) -> int:
        return 1 + self.branches + self.n

    @property
    def queues(self) -> list[str]:
        return [QUEUE, CHILD_QUEUE] if self.kind == "cross" else [QUEUE]

    def spec(self) -> Spec:
        if self.kind == "tree":
            per = self.n // self.branches
            leaves = iter(range(self.n))
            branches = [
                Spec(
                    BRANCH,
                    QUEUE,
                    {"i": b},
                    [
                        Spec(LEAF, QUEUE, {"i": next(leaves)})
                        for _ in range(per + (1 if b < self.n % self.branches else 0))
                    ],
                )
                for b in range(self.branches)
            ]
            return Spec(ROOT, QUEUE, {}, branches)
        queue = CHILD_QUEUE if self.kind == "cross" else QUEUE
        return Spec(ROOT, QUEUE, {}, [Spec(LEAF, queue, {"i": i}) for i in range(self.n)])


def default_topologies(sizes=(100, 1000, 10000), tree=(20, 2000), cross=10000) -> list[Topology]:
    """Seed 003's topologies: wide for each size, the 3-tier tree, cross-queue."""
    out = [Topology("wide", n) for n in sizes]
    if tree:
        out.append(Topology("tree", tree[1], tree[0]))
    if cross:
        out.append(Topology("cross", cross))
    return out


def handler_value(name: str, payload: dict):
    """What every benchmark handler returns: the node's index, "done" for the root."""
    return payload["i"] if name != ROOT else "done"
