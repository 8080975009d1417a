"""Job references: how the public API names a job other than by ``(queue,
id)`` arguments (docs/howto/read-flows.md#job-references).

``JobRef(queue, id)`` is the value every public result carries where it
used to carry a Redis key (``children_values()``, ``dependencies()``,
``get_flow()``, ``FlowRef.nodes``, ``Outcome``, signals, the admin). The
Redis keys stay inside the protocol: the Lua scripts keep their child refs
(``P:{q}:job:<id>``) and ``protocol/`` turns each one into a ``JobRef`` at
its edge (``Keyspace.job_ref``).

For one release the old forms keep working with a ``DeprecationWarning``
saying what to write instead (docs/howto/read-flows.md#deprecated-raw-keys): a
``RefDict`` (the dict results) and a ``RefList`` (``unprocessed``) still
find an entry by its raw key string; ``as_ref`` still takes a raw key under
the client's own prefix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from .keyspace import ID_RULE, QUEUE_RULE, validate_id, validate_queue

T = TypeVar("T")


class _Pair(NamedTuple):
    queue: str
    id: str


class JobRef(_Pair):
    """One job, named by its queue and id: ``JobRef("orders", "o42")``.

    A value: frozen, hashable, ordered by ``(queue, id)``; a tuple, so
    ``queue, job_id = ref`` unpacks it and it equals the ``(queue, id)``
    pair it names. ``str(ref)`` is ``"orders/o42"`` and ``JobRef.parse``
    reads that back. Raises ``ValueError`` with the same message as a bad
    ``(queue, id)`` argument anywhere else (``keyspace.validate_queue`` /
    ``validate_id``), so a bad ref is refused before any write.
    docs/howto/read-flows.md#job-references
    """

    __slots__ = ()

    def __new__(cls, queue: str, id: str) -> JobRef:
        return tuple.__new__(cls, (validate_queue(queue), validate_id(id)))

    @classmethod
    def _trusted(cls, queue: str, job_id: str) -> JobRef:
        """A ref of names the keyspace already checked (a key it parsed)."""
        return tuple.__new__(cls, (queue, job_id))

    @classmethod
    def parse(cls, text: str) -> JobRef:
        """``"queue/id"`` (what ``str()`` gives) as a ``JobRef``; the id
        may itself hold ``/``, a queue name never does. Raises
        ``ValueError`` for a value that is not such a string or a bad
        name."""
        if not isinstance(text, str) or "/" not in text:
            raise ValueError(
                f"invalid job ref {text!r}: write 'queue/id' ({QUEUE_RULE}; {ID_RULE})"
            )
        queue, _, job_id = text.partition("/")
        return cls(queue, job_id)

    def __str__(self) -> str:
        return f"{self[0]}/{self[1]}"

    def __repr__(self) -> str:
        return f"JobRef({self[0]!r}, {self[1]!r})"


def _key_warning(key: str, ref: JobRef, stacklevel: int) -> None:
    warnings.warn(
        f"a raw Redis key as a job ref is deprecated: write {ref!r} instead of {key!r}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


def _mapped(parse: Callable[[str], tuple] | None, key: Any) -> Any:
    """``key``, or the ``JobRef`` of a raw key string ``parse`` reads (warned
    of at the caller of the lookup)."""
    if isinstance(key, str) and ":" in key and parse is not None:
        try:
            ref = JobRef._trusted(*parse(key))
        except ValueError:
            return key
        _key_warning(key, ref, 3)
        return ref
    return key


class RefDict(dict):
    """A dict keyed by ``JobRef`` (``children_values()``,
    ``ignored_failures()``, ``dependencies()``' maps). Iteration yields
    ``JobRef``\\ s. For one release a lookup by a raw key string
    (``d[mq.keys.job("q", "c1")]``, ``.get``, ``in``) still finds the entry,
    with a ``DeprecationWarning`` naming the ``JobRef`` to write
    (docs/howto/read-flows.md#deprecated-raw-keys). ``parse(key) -> (queue, id)`` is the
    keyspace's, raising ``ValueError`` for a string that is not its key."""

    def __init__(self, items: Iterable = (), parse: Callable[[str], tuple] | None = None):
        super().__init__(items)
        self._parse = parse

    def __getitem__(self, key: Any) -> Any:
        return super().__getitem__(_mapped(self._parse, key))

    def get(self, key: Any, default: Any = None) -> Any:
        return super().get(_mapped(self._parse, key), default)

    def __contains__(self, key: Any) -> bool:
        return super().__contains__(_mapped(self._parse, key))

    def __reduce__(self):
        return (RefDict, (dict(self),))


class RefList(list):
    """A list of ``JobRef`` (``Dependencies.unprocessed``) in which, for one
    release, ``raw_key in refs`` still answers, with a ``DeprecationWarning``
    (docs/howto/read-flows.md#deprecated-raw-keys)."""

    def __init__(self, items: Iterable = (), parse: Callable[[str], tuple] | None = None):
        super().__init__(items)
        self._parse = parse

    def __contains__(self, item: Any) -> bool:
        return super().__contains__(_mapped(self._parse, item))

    def __reduce__(self):
        return (RefList, (list(self),))


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a paged read (docs/howto/read-flows.md#paged-reads): ``items`` (what the
    unpaged call returns, for this page's children only), ``next_cursor``
    (pass it back as ``cursor`` for the next page; 0 when this page is the
    last, as Redis's SCAN) and ``total`` (the parent's child count)."""

    items: T
    next_cursor: int
    total: int


def str_keys(value: Any) -> tuple[Any, bool]:
    """``value`` with every ``JobRef`` dict key (at any depth of dicts and
    lists) as its ``"queue/id"`` text, and whether any was found: JSON keys
    are strings, so a handler may return ``job.children_values()`` as it is
    (docs/howto/read-flows.md#job-references)."""
    if isinstance(value, dict):
        found = False
        out = {}
        for k, v in value.items():
            v, inner = str_keys(v)
            found = found or inner or isinstance(k, JobRef)
            out[str(k) if isinstance(k, JobRef) else k] = v
        return (out, True) if found else (value, False)
    if isinstance(value, list | tuple) and not isinstance(value, JobRef):
        items = [str_keys(v) for v in value]
        if any(inner for _, inner in items):
            return [v for v, _ in items], True
    return value, False


def ref_list(value: Any) -> Any:
    """``value`` as a list of job refs when it is one ref (a ``JobRef`` or
    ``"queue/id"``: RQ's ``depends_on=job``); anything else as it is, for
    its caller to check (docs/howto/canvas.md#depends-on-existing-jobs)."""
    return [value] if isinstance(value, str | JobRef) else value


def as_ref(value: Any, keyspace: Any, stacklevel: int = 2) -> JobRef:
    """A job given as a ``JobRef``, a handle whose ``ref`` is one (a
    ``FlowRef``: its root job), a ``(queue, id)`` pair, ``"queue/id"``
    or (deprecated, with a ``DeprecationWarning``) a raw key under
    ``keyspace``'s prefix, as a ``JobRef``. Raises ``ValueError`` for a bad
    name, and for a key under another prefix, naming both prefixes;
    ``stacklevel`` is ``warnings.warn``'s, counted from here (2: the caller of
    ``as_ref``). docs/howto/read-flows.md#deprecated-raw-keys"""
    if isinstance(value, JobRef):
        return value
    if isinstance(ref := getattr(value, "ref", None), JobRef):  # add_flow's FlowRef: the root
        return ref
    if isinstance(value, tuple) and len(value) == 2:
        return JobRef(*value)
    if isinstance(value, str) and ":" in value:
        key_prefix = keyspace.key_prefix(value)
        if key_prefix is None:
            raise ValueError(f"invalid job ref {value!r}: pass JobRef(queue, id)")
        if key_prefix != keyspace.prefix:
            raise ValueError(
                f"job key {value!r} is under prefix {key_prefix!r}, but this "
                f"EchoMQ's prefix is {keyspace.prefix!r}: pass JobRef(queue, id)"
            )
        ref = JobRef(*keyspace.parse_ref(value))
        _key_warning(value, ref, stacklevel)
        return ref
    if isinstance(value, str):
        return JobRef.parse(value)
    raise ValueError(f"invalid job ref {value!r}: pass JobRef(queue, id)")
