"""The house's direction, checked from the source (issue 11).

The modules of ``echomq_django/`` stand on floors. A module may import
modules on its own floor or below, never above; the import graph, imports
inside functions and under ``TYPE_CHECKING`` included, has no cycle; and a
package import sits at the top of its module (only ``AppConfig.ready()``
imports inside a function, where Django wants it):

1. words: data shapes and defaults (``jobs``), key names (``keyspace``),
   errors (``exceptions``), the handler registry, the signals, logging
   set-up, the private test server. ``jobs``, ``keyspace`` and
   ``exceptions`` import nothing of the package at all.
2. model and wire: flow planning (``flows``), the script registry
   (``scripts``), the read API (``reads``), the admin mirror's tables
   (``models``).
3. protocol: ``EchoMQ`` (``client``, with its flow half ``flowcalls``),
   the only caller of the Lua scripts.
4. settings: ``conf`` (reads ``ECHOMQ``, builds the process-wide ``EchoMQ``).
5. runner parts: the wake-ups and timers (``wake``), the process
   registry, the outage backoff (``outage``), the handler threads
   (``pool``), the worker's reporter (``reporter``) and its claiming
   loop (``worker_loop``).
6. library: the module API, the runners (``worker``, ``pump``), the admin
   mirror, stats and metrics.
7. Django glue: the checks, the admin's page builders, the app config, the
   URLs and template tags, the package's public names (``__init__``).
8. entry points: the admin, the management commands, the migrations.

A new module gets a floor in ``FLOORS`` below. The second half checks
"one floor speaks Lua": every ``lua/*.lua`` script is called from exactly
one method of ``EchoMQ``, and ``scripts.run`` / ``run_many`` appear nowhere
else but in the named tests that drive raw script calls on purpose; the
runners, the mirror, the admin and the commands reach Redis through
``EchoMQ`` methods only (never ``mq.client``); and no module but
keyspace.py spells a key suffix.
"""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "echomq_django"

FLOORS = [
    [
        *("jobs", "keyspace", "exceptions", "handlers", "signals", "logs", "devserver"),
        *("retention", "events"),
    ],
    ["flows", "scripts", "reads", "models", "scheduling"],
    ["client", "flowcalls", "lifecalls", "eventcalls", "schedcalls", "bulk"],
    ["conf"],
    ["wake", "registry", "outage", "pool", "reporter", "timeouts", "entries", "worker_loop"],
    [
        *("api", "worker", "pump", "mirror", "stats", "metrics", "tasks", "outbox"),
        *("dispatch", "schedule"),
    ],
    [
        *("checks", "admin_display", "admin_pages", "apps", "urls"),
        *("templatetags", "templatetags.*", "__init__"),
    ],
    ["admin", "admin_actions", "management", "management.*", "migrations", "migrations.*"],
]
BOTTOM = {"jobs", "keyspace", "exceptions", "retention"}  # import nothing of the package
NESTED_ALLOWED = {"apps"}  # AppConfig.ready() imports checks and handlers

# EchoMQ and its mixins: the only callers of scripts.run / run_many
PROTOCOL = {"client", "flowcalls", "lifecalls", "eventcalls", "schedcalls", "bulk"}
RAW_SCRIPT_TESTS = {  # (file, test) that drive raw script calls on purpose
    ("tests/test_enqueue_many.py", "test_a_replayed_call_writes_nothing_twice"),
    ("tests/test_replays.py", "test_a_replayed_retry_reports_success_and_retries_once"),
    ("tests/test_replays.py", "test_a_replayed_claim_returns_the_same_jobs"),
    ("tests/test_replays.py", "test_a_replayed_enqueue_is_the_same_job"),
    ("tests/test_scripts.py", "test_registry_refuses_a_call_that_breaks_the_header"),
    ("tests/test_scripts.py", "test_noscript_fallback_run"),
    ("tests/test_scripts.py", "test_noscript_fallback_run_many"),
}
# modules that must not call the redis-py client themselves
THROUGH_ECHOMQ = [
    "pump",
    "worker",
    "worker_loop",
    "reporter",
    "dispatch",
    "mirror",
    "admin",
    "admin_pages",
    "management.*",
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def floor_of(name: str) -> int:
    for i, names in enumerate(FLOORS):
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in names):
            return i + 1
    raise AssertionError(
        f"module echomq_django/{name} has no floor: add it to FLOORS in tests/test_structure.py"
    )


def _target(parts: list[str]) -> str | None:
    """The package module named by ``parts`` (``[]``: the package itself)."""
    name = ".".join(parts) or "__init__"
    return name if name in MODULES else None


def imports_in(source: str, name: str, is_package: bool = False) -> list[tuple[str, int, bool]]:
    """``(imported module, line, inside a function)`` for each package import
    in ``source``, the text of module ``name``, wherever it stands."""
    tree = ast.parse(source)
    nested: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            nested.update(id(n) for n in ast.walk(fn) if n is not fn)
    here = [] if name == "__init__" else name.split(".")
    package = here if is_package else here[:-1]  # where relative imports start
    out = []
    for node in ast.walk(tree):
        targets: list[list[str]] = []
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, *rest = alias.name.split(".")
                if head == "echomq_django":
                    targets.append(rest)
        elif isinstance(node, ast.ImportFrom):
            module = node.module.split(".") if node.module else []
            if node.level:
                mod = [*package[: len(package) - node.level + 1], *module]
            elif module[:1] == ["echomq_django"]:
                mod = module[1:]
            else:
                continue
            for alias in node.names:  # "from . import signals" imports a module
                targets.append([*mod, alias.name] if _target([*mod, alias.name]) else mod)
        for parts in targets:
            target = _target(parts)
            if target and target != name:
                out.append((target, node.lineno, id(node) in nested))
    return out


def imports_of(name: str) -> list[tuple[str, int, bool]]:
    path = MODULES[name]
    return imports_in(path.read_text(), name, path.name == "__init__.py" and name != "__init__")


GRAPH = {name: imports_of(name) for name in MODULES}


def test_every_module_has_a_floor():
    for name in MODULES:
        floor_of(name)


def test_no_import_runs_upward():
    upward = [
        f"echomq_django/{name} (floor {floor_of(name)}) imports {target} "
        f"(floor {floor_of(target)}) at line {line}"
        for name, edges in GRAPH.items()
        for target, line, _ in edges
        if floor_of(target) > floor_of(name)
    ]
    assert upward == []


def test_the_bottom_imports_nothing_of_the_package():
    assert {name: [t for t, _, _ in GRAPH[name]] for name in BOTTOM} == {n: [] for n in BOTTOM}


def test_package_imports_are_at_the_top():
    nested = [
        f"echomq_django/{name} line {line} imports {target} inside a function"
        for name, edges in GRAPH.items()
        if name not in NESTED_ALLOWED
        for target, line, inside in edges
        if inside
    ]
    assert nested == []


def test_the_import_graph_has_no_cycle():
    edges = {name: sorted({t for t, _, _ in GRAPH[name]}) for name in GRAPH}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    cycles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in edges[name]:
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert [" -> ".join(c) for c in cycles] == []


def test_the_graph_builder_sees_every_form_of_import():
    source = (
        "from . import signals\n"
        "from .jobs import Job\n"
        "import echomq_django.conf\n"
        "from echomq_django import Flow\n"
        "def f():\n"
        "    from .client import EchoMQ\n"
    )
    assert imports_in(source, "worker") == [
        ("signals", 1, False),
        ("jobs", 2, False),
        ("conf", 3, False),
        ("__init__", 4, False),
        ("client", 6, True),
    ]
    assert imports_in("from ...jobs import Job\n", "management.commands.runworker") == [
        ("jobs", 1, False)
    ]


# -- one floor speaks Lua -----------------------------------------------------


def _script_calls(path: Path):
    """``(function name, line)`` of every ``<x>.scripts.run(...)`` /
    ``run_many(...)`` call in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Module):
            continue
        body = fn.body if isinstance(fn, ast.Module) else [fn]
        for node in (n for b in body for n in ast.walk(b)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("run", "run_many")
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "scripts"
            ):
                yield (getattr(fn, "name", "<module>"), node.lineno)


def test_scripts_are_run_only_by_echomq():
    outside = []
    for folder in ("echomq_django", "tests", "bench", "testproject"):
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if folder == "echomq_django" and module_name(path) in PROTOCOL:
                continue
            for func, line in _script_calls(path):
                if func != "<module>" and (rel, func) not in RAW_SCRIPT_TESTS:
                    outside.append(f"{rel}:{line} in {func}")
    assert outside == []


def test_every_script_has_exactly_one_caller():
    """Each ``lua/<name>.lua`` is named, as a string, in exactly one method of
    ``EchoMQ`` (client.py, flowcalls.py): the one that builds its KEYS and
    ARGV. (No other module can run it: see the test above.)"""
    names = {p.stem for p in (REPO / "lua").glob("*.lua")}
    callers: dict[str, set[str]] = {n: set() for n in names}
    for module in sorted(PROTOCOL):
        tree = ast.parse(MODULES[module].read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Constant) and node.value in names:
                    callers[node.value].add(f"{module}.{fn.name}")
    assert {n: sorted(c) for n, c in callers.items() if len(c) != 1} == {}


def test_runners_and_admin_reach_redis_through_echomq_only():
    """No ``<x>.client.<command>(...)`` in the runners, mirror, admin or
    commands: they call ``EchoMQ`` / ``Reads`` methods."""
    raw = []
    for name, path in MODULES.items():
        if not any(fnmatch.fnmatchcase(name, p) for p in THROUGH_ECHOMQ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "client"
            ):
                raw.append(f"echomq_django/{name}:{node.lineno} .client.{node.func.attr}()")
    assert raw == []


def test_no_module_but_the_keyspace_spells_a_key_suffix():
    from echomq_django import keyspace

    suffixes = [s for s in keyspace.QUEUE_KEYS.values() if ":" in s]
    suffixes += [*keyspace.JOB_KEYS.values(), keyspace.CLAIM_PREFIX, keyspace.DEDUP_PREFIX]
    suffixes += [keyspace.OP_PREFIX, keyspace.GC_PREFIX]
    suffixes += [keyspace.JOB_PREFIX]
    spelled = []
    for name, path in MODULES.items():
        if name == "keyspace":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", "") in ("queue_key", "job_part")
                and any(isinstance(a, ast.Constant) for a in node.args[1:])
            ):
                spelled.append(f"echomq_django/{name}:{node.lineno} {node.func.attr}()")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                hits = [s for s in suffixes if s in node.value and len(node.value) < 40]
                if hits and not node.value.strip().startswith(('"""', "#")):
                    spelled.append(f"echomq_django/{name}:{node.lineno} {node.value!r}")
    assert spelled == []
