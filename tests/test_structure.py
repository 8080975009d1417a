"""The house, checked from the source (docs/explanation/house.md draws it).

The package is a few folders that stand on layers. The rules, all checked
below from the code's own imports (imports inside functions and under
``TYPE_CHECKING`` included):

1. ``core/`` imports only the standard library: no redis, no Django, nothing
   of the package outside ``core/``.
2. Only ``protocol/`` (and ``testing/``, the private test server) imports
   ``redis``; everything else reaches Redis through ``EchoMQ`` and its parts
   and catches ``EchoMQError``, never ``redis.RedisError``.
3. ``protocol/`` imports no Django.
4. ``runners/`` never import ``monitoring/``, ``admin/``, ``api``,
   ``commit_outbox`` or ``tasks``: the commands hand them what they need.
5. Nothing imports upward: each module stands on a layer (``LAYERS``) and
   imports only its own layer or lower ones.
6. No loops, and a package import sits at the top of its module (only
   ``AppConfig.ready()`` imports inside a function, where Django wants it).
7. No module over ``MAX_LINES`` lines, no folder with more than
   ``MAX_MODULES`` modules (``__init__`` not counted).

And one folder speaks Lua: every ``lua/*.lua`` script is named in exactly one
function of ``protocol/``, whose module docstring lists it; no module but
``core/keyspace.py`` spells a key suffix; ``docs/explanation/house.md`` names every module.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "echomq_django"
HOUSE_DOC = REPO / "docs" / "explanation" / "house.md"
MAX_LINES = 450
MAX_MODULES = 15  # the root holds Django's conventional files; a folder about a dozen

# Bottom to top. A folder ("core/") takes every module inside it.
LAYERS = [
    ["core/", "testing/", "tracing/", "signals", "handlers", "logs"],  # words; spans
    ["protocol/", "models"],  # EchoMQ and its parts; the admin's tables
    ["conf/"],  # ECHOMQ read and checked; the process's EchoMQ
    ["runners/", "commit_outbox"],  # threads and loops; the commit outbox
    ["api/", "monitoring/", "canvas/"],  # the module API; stats and metrics; the canvas
    ["admin/", "tasks", "templatetags/"],  # the admin; Django's tasks backend
    ["checks", "urls", "apps", "__init__"],  # Django glue and the public names
    ["management/", "migrations/"],  # entry points
]
NESTED_ALLOWED = {"apps"}  # AppConfig.ready() imports checks and handlers
REDIS_ALLOWED = ("protocol.", "testing.")
RUNNERS_NEVER = ("monitoring.", "admin.", "api", "commit_outbox", "tasks")
RAW_SCRIPT_TESTS = {  # (file, test) that drive raw script calls on purpose
    ("tests/test_enqueue_many.py", "test_a_replayed_call_writes_nothing_twice"),
    ("tests/test_replays.py", "test_a_replayed_retry_reports_success_and_retries_once"),
    ("tests/test_replays.py", "test_a_replayed_claim_returns_the_same_jobs"),
    ("tests/test_replays.py", "test_a_replayed_enqueue_is_the_same_job"),
    ("tests/test_scripts.py", "test_registry_refuses_a_call_that_breaks_the_header"),
    ("tests/test_scripts.py", "test_noscript_fallback_run"),
    ("tests/test_scripts.py", "test_noscript_fallback_run_many"),
    ("tests/test_scripts_write.py", "test_an_argument_hiredis_does_not_pack_gets_redis_py_s_error"),
    (
        "tests/test_routing.py",
        "test_a_call_whose_slot_is_migrating_is_not_now_and_runs_once_it_settles",
    ),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {module_name(p) for p in PACKAGE.rglob("__init__.py")}


def layer_of(name: str) -> int:
    for i, names in enumerate(LAYERS):
        for entry in names:
            if entry.endswith("/"):
                folder = entry[:-1]
                if name == folder or name.startswith(folder + "."):
                    return i + 1
            elif name == entry:
                return i + 1
    raise AssertionError(
        f"module echomq_django/{name} stands on no layer: put it in a folder, "
        "or add it to LAYERS in tests/test_structure.py"
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
    return imports_in(path.read_text(), name, name in PACKAGES and name != "__init__")


def outside_imports(name: str) -> set[str]:
    """The top-level names of the packages outside echomq_django that module
    ``name`` imports (``redis``, ``django``, ``json``...)."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    out.discard("echomq_django")
    return out


GRAPH = {name: imports_of(name) for name in MODULES}
STDLIB = set(__import__("sys").stdlib_module_names) | {"__future__"}


def test_every_module_stands_on_a_layer():
    assert sorted(n for n in MODULES if not _on_a_layer(n)) == []


def _on_a_layer(name: str) -> bool:
    try:
        layer_of(name)
    except AssertionError:
        return False
    return True


def test_core_imports_only_the_standard_library():
    core = [n for n in MODULES if n.startswith("core.") or n == "core"]
    assert core, "no core/ modules found"
    foreign = {n: sorted(outside_imports(n) - STDLIB) for n in core}
    inside = {n: sorted(t for t, _, _ in GRAPH[n] if not t.startswith("core")) for n in core}
    assert {n: v for n, v in foreign.items() if v} == {}
    assert {n: v for n, v in inside.items() if v} == {}


def test_only_the_protocol_imports_redis():
    importers = sorted(n for n in MODULES if "redis" in outside_imports(n))
    assert [n for n in importers if not n.startswith(REDIS_ALLOWED)] == []
    assert any(n.startswith("protocol.") for n in importers)


def test_the_protocol_imports_no_django():
    protocol = sorted(n for n in MODULES if n.startswith("protocol"))
    assert [n for n in protocol if {"django", "asgiref"} & outside_imports(n)] == []


def test_runners_never_import_monitoring_admin_or_the_database_outbox():
    wrong = [
        f"echomq_django/{name} imports {target} at line {line}"
        for name, edges in GRAPH.items()
        if name.startswith("runners")
        for target, line, _ in edges
        if target.startswith(RUNNERS_NEVER)
    ]
    assert wrong == []


def test_no_import_runs_upward():
    upward = [
        f"echomq_django/{name} (layer {layer_of(name)}) imports {target} "
        f"(layer {layer_of(target)}) at line {line}"
        for name, edges in GRAPH.items()
        for target, line, _ in edges
        if layer_of(target) > layer_of(name)
    ]
    assert upward == []


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


def test_modules_stay_small_and_folders_few():
    long = {
        f"echomq_django/{MODULES[n].relative_to(PACKAGE)}": lines
        for n in MODULES
        if (lines := len(MODULES[n].read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
    crowded = {}
    for folder in [PACKAGE, *(p.parent for p in PACKAGE.rglob("__init__.py"))]:
        count = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
        if count > MAX_MODULES:
            crowded[folder.relative_to(REPO).as_posix()] = count
    assert crowded == {}


def test_the_graph_builder_sees_every_form_of_import():
    source = (
        "from .. import signals\n"
        "from ..core.jobs import Job\n"
        "import echomq_django.conf\n"
        "from echomq_django import Flow\n"
        "from . import pool\n"
        "def f():\n"
        "    from ..protocol.client import EchoMQ\n"
    )
    assert imports_in(source, "runners.worker") == [
        ("signals", 1, False),
        ("core.jobs", 2, False),
        ("conf", 3, False),
        ("__init__", 4, False),
        ("runners.pool", 5, False),
        ("protocol.client", 7, True),
    ]
    assert imports_in("from ...core.jobs import Job\n", "management.commands.runworker") == [
        ("core.jobs", 1, False)
    ]


def test_the_house_doc_names_every_module():
    text = HOUSE_DOC.read_text()
    named = set(re.findall(r"`([a-z_][a-z0-9_/]*\.py)`", text))
    missing = sorted(
        MODULES[n].relative_to(PACKAGE).as_posix()
        for n in MODULES
        if MODULES[n].name != "__init__.py" or n == "__init__"
        if MODULES[n].relative_to(PACKAGE).as_posix() not in named
        and not n.startswith("migrations")
    )
    assert missing == []


# -- one folder speaks Lua -----------------------------------------------------


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
            if folder == "echomq_django" and module_name(path).startswith("protocol."):
                continue
            for func, line in _script_calls(path):
                if func != "<module>" and (rel, func) not in RAW_SCRIPT_TESTS:
                    outside.append(f"{rel}:{line} in {func}")
    assert outside == []


def test_every_script_has_exactly_one_caller():
    """Each ``lua/<name>.lua`` is named, as a string, in exactly one method of
    ``protocol/``: the one that builds its KEYS and ARGV. (No other module
    can run it: see the test above.)"""
    names = {p.stem for p in (REPO / "lua").glob("*.lua")}
    callers: dict[str, set[str]] = {n: set() for n in names}
    for module in sorted(n for n in MODULES if n.startswith("protocol.")):
        tree = ast.parse(MODULES[module].read_text())
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                for name in _scripts_named(fn, names):
                    callers[name].add(f"{module}.{fn.name}")
    assert {n: sorted(c) for n, c in callers.items() if len(c) != 1} == {}


def _scripts_named(fn: ast.FunctionDef, names: set[str]) -> set[str]:
    """The scripts function ``fn`` names where a script is named: the first
    argument of ``run`` / ``run_many`` / ``run_many_confirmed``, or the first
    item of a ``(name, keys, args)`` tuple."""
    found = set()
    for node in ast.walk(fn):
        first = None
        if isinstance(node, ast.Tuple) and node.elts:
            first = node.elts[0]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("run", "run_many", "run_many_confirmed")
            and node.args
        ):
            first = node.args[0]
        if isinstance(first, ast.Constant) and first.value in names:
            found.add(first.value)
    return found


def test_only_the_protocol_sends_redis_commands():
    """No ``<x>.client.<command>(...)`` outside ``protocol/`` and ``testing/``:
    the runners, the admin, monitoring and the commands call ``EchoMQ`` and its
    parts."""
    raw = []
    for name, path in MODULES.items():
        if name.startswith(REDIS_ALLOWED):
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


def test_each_protocol_module_lists_the_scripts_it_runs():
    """A protocol module's docstring names (as ``lua/<name>.lua``) exactly the
    scripts its code names."""
    names = {p.stem for p in (REPO / "lua").glob("*.lua")}
    wrong = {}
    for module in sorted(n for n in MODULES if n.startswith("protocol.")):
        tree = ast.parse(MODULES[module].read_text())
        listed = set(re.findall(r"lua/([a-z_]+)\.lua", ast.get_docstring(tree) or ""))
        run = {
            name
            for fn in ast.walk(tree)
            if isinstance(fn, ast.FunctionDef)
            for name in _scripts_named(fn, names)
        }
        if listed != run:
            wrong[module] = {
                "listed, not run": sorted(listed - run),
                "run, not listed": sorted(run - listed),
            }
    assert wrong == {}


def test_no_module_but_the_keyspace_spells_a_key_suffix():
    from echomq_django.core import keyspace

    suffixes = [s for s in keyspace.QUEUE_KEYS.values() if ":" in s]
    suffixes += [*keyspace.JOB_KEYS.values(), keyspace.CLAIM_PREFIX, keyspace.DEDUP_PREFIX]
    suffixes += [keyspace.OP_PREFIX, keyspace.GC_PREFIX]
    suffixes += [keyspace.JOB_PREFIX]
    spelled = []
    for name, path in MODULES.items():
        if name == "core.keyspace":
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


def test_the_wheel_lists_every_package() -> None:
    """pyproject.toml names its packages one by one (the Lua folder is mapped
    into the package): a new room left out would be missing from the wheel."""
    import tomllib

    listed = set(
        tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(REPO).parts)
        for init in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages"
