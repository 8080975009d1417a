"""The canvas (docs/howto/canvas.md): Celery-style signatures, chains,
groups and chords, each compiled to one flow and landed by ``add_flow``
(docs/explanation/canvas.md)."""

from .results import group_results, previous_result
from .signatures import Canvas, Chain, Chord, Group, Signature, chain, chord, group, task

__all__ = [
    "Canvas",
    "Chain",
    "Chord",
    "Group",
    "Signature",
    "chain",
    "chord",
    "group",
    "group_results",
    "previous_result",
    "task",
]
