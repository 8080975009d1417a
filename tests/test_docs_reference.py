"""The reference pages against the code, both ways (docs/reference/).

Each test reads one page's Markdown tables (no Sphinx build) and compares
the names in their first column with what the code knows: setting keys
(``conf/schema.py`` and the modules it delegates to), each management
command's argparse flags, the signals in ``echomq_django/signals.py``, every
system check id in the package, the Prometheus metrics of a real scrape,
the fields of a real ``echomq.stats/1`` document and ``echomq_django.__all__``.
A name in the code but not on its page fails, and so does a name on the page
the code no longer has; each assertion names exactly the missing ones.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = REPO / "docs" / "reference"
PACKAGE = REPO / "echomq_django"
CODE_SPAN = re.compile(r"`([^`]+)`")


def sections(page: str) -> dict[str, str]:
    """The page's ``## `` sections by heading text ("" for the part before
    the first), each with its body."""
    parts = re.split(r"^## +(.+)$", (REFERENCE / page).read_text(), flags=re.MULTILINE)
    return {"": parts[0]} | {t.strip(): b for t, b in zip(parts[1::2], parts[2::2], strict=True)}


def first_cells(body: str) -> list[str]:
    """The first cell of every table row of ``body`` that holds a code span
    (header and separator rows hold none)."""
    cells = []
    for line in body.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            cell = line.split("|")[1]
            if "`" in cell:
                cells.append(cell)
    return cells


def names(body: str) -> set[str]:
    """The first word of each code span in the tables' first column:
    ``--lease-ms MS`` is ``--lease-ms``."""
    return {span.split()[0] for cell in first_cells(body) for span in CODE_SPAN.findall(cell)}


def both_ways(documented: set[str], in_code: set[str], page: str) -> None:
    missing_from_page = sorted(in_code - documented)
    gone_from_code = sorted(documented - in_code)
    assert missing_from_page == [], f"in the code but not in docs/reference/{page}"
    assert gone_from_code == [], f"in docs/reference/{page} but not in the code"


# -- settings ------------------------------------------------------------------
def test_every_setting_key_is_in_settings_md():
    from echomq_django import tasks
    from echomq_django.conf import schema
    from echomq_django.core.retention import KEEP_PARTS
    from echomq_django.monitoring.metrics import METRICS_KEYS
    from echomq_django.runners.periodic import ENTRY_KEYS

    page = sections("settings.md")
    both_ways(names(page["Top-level keys"]), set(schema.TOP_KEYS), "settings.md, Top-level keys")
    both_ways(names(page["Per queue"]), set(schema.QUEUE_KEYS), "settings.md, Per queue")
    both_ways(names(page["Retention values"]), set(KEEP_PARTS), "settings.md, Retention values")
    both_ways(names(page["METRICS"]), set(METRICS_KEYS), "settings.md, METRICS")
    both_ways(names(page["SCHEDULE entries"]), set(ENTRY_KEYS), "settings.md, SCHEDULE entries")
    both_ways(
        names(page["The tasks backend"]), set(tasks.OPTION_KEYS), "settings.md, tasks backend"
    )


def test_settings_md_gives_the_code_s_defaults():
    from echomq_django.conf.schema import SIGNAL_KEYS
    from echomq_django.core.jobs import MAX_PAYLOAD_BYTES, QUEUE_DEFAULTS
    from echomq_django.core.retention import DEFAULT_KEEP

    in_code = {
        **QUEUE_DEFAULTS,
        **DEFAULT_KEEP,
        **{key: default for key, (default, _low, _cid) in SIGNAL_KEYS.items()},
        "MAX_PAYLOAD_BYTES": MAX_PAYLOAD_BYTES,
    }
    page = sections("settings.md")
    documented = {}
    for line in (page["Top-level keys"] + page["Per queue"]).splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0].startswith("`") and cells[0].strip("`") in in_code:
            documented[cells[0].strip("`")] = json.loads(CODE_SPAN.findall(cells[2])[0])
    assert documented == in_code


def test_rate_limit_keys_are_exactly_the_ones_the_check_accepts():
    # RATE_LIMIT must have exactly its keys (E050): the documented set passes
    # the check, so it is that set.
    from echomq_django.runners.periodic import problems

    documented = names(sections("settings.md")["RATE_LIMIT"])
    cfg = {"QUEUES": {"q": {"RATE_LIMIT": {**dict.fromkeys(documented, 1), "MODE": "sliding"}}}}
    assert [cid for cid, _m, _h in problems(cfg)] == []
    assert documented == {"MAX", "PER_MS", "MODE"}


# -- commands --------------------------------------------------------------------
def command_names() -> set[str]:
    folder = PACKAGE / "management" / "commands"
    return {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_")}


def parser_names(parser, base: set[str]) -> set[str]:
    """A parser's own arguments: long option strings and positional
    metavars, less Django's common options (``base``)."""
    out = set()
    for action in parser._actions:
        if action.option_strings:
            out |= {s for s in action.option_strings if s.startswith("--")} - base
        else:
            out.add(action.metavar or action.dest)
    return out


def test_every_command_is_in_commands_md():
    page = sections("commands.md")
    documented = {m for title in page for m in CODE_SPAN.findall(title)}
    both_ways(documented, command_names(), "commands.md (its ## headings)")


@pytest.mark.parametrize("name", sorted(command_names()))
def test_every_command_flag_is_in_commands_md(name):
    from django.core.management import load_command_class
    from django.core.management.base import BaseCommand

    base = parser_names(BaseCommand().create_parser("manage.py", "base"), set())
    parser = load_command_class("echomq_django", name).create_parser("manage.py", name)
    documented = names(sections("commands.md")[f"`{name}`"])
    both_ways(documented, parser_names(parser, base), f"commands.md, `{name}`")
    # a default given as a code span (`500`, `127.0.0.1`) is the parser's
    defaults = {s: a.default for a in parser._actions for s in a.option_strings}
    for line in sections("commands.md")[f"`{name}`"].splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) == 4 and re.fullmatch(r"`[^`]+`", cells[3]) and "--" in cells[0]:
            flag, given = CODE_SPAN.findall(cells[0])[0].split()[0], cells[3].strip("`")
            default = defaults[flag]
            same = float(given) == default if isinstance(default, int | float) else given == default
            assert same, f"commands.md gives {flag} the default {given}, the parser {default!r}"


# -- signals ---------------------------------------------------------------------
def test_every_signal_is_in_signals_md():
    from django.dispatch import Signal

    from echomq_django import signals

    in_code = {n for n, v in vars(signals).items() if isinstance(v, Signal)}
    both_ways(names(sections("signals.md")[""]), in_code, "signals.md")


def test_durable_signals_and_their_arguments_are_as_signals_md_says():
    # The dispatcher sends SIGNAL_OF's signals with an Event's kwargs().
    from echomq_django.protocol.signal_events import SIGNAL_OF, Event

    rows = {}
    for line in sections("signals.md")[""].splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0].startswith("`"):
            durable, args = cells[2].startswith("yes"), set(CODE_SPAN.findall(cells[4]))
            rows[cells[0].strip("`")] = (durable, args)
    durable = {name for name, (yes, _args) in rows.items() if yes}
    both_ways(durable, set(SIGNAL_OF.values()), "signals.md, durable")
    for kind, name in SIGNAL_OF.items():
        event = Event(queue="q", xid="1-0", kind=kind, job_id="j", job_name="n", value=None)
        assert rows[name][1] == set(event.kwargs()), f"signals.md, the arguments of {name}"


# -- system checks ---------------------------------------------------------------
def check_ids_in_package() -> set[str]:
    """Every check id the package spells: ``echomq_django.E001`` in full, or
    a bare quoted ``"E021"`` that is prefixed where it is reported."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        found |= set(re.findall(r"echomq_django\.([EW]\d{3})\b", text))
        found |= set(re.findall(r"[\"']([EW]\d{3})[\"']", text))
    return found


def test_every_check_id_is_in_checks_md():
    documented = {
        span.removeprefix("echomq_django.")
        for section in sections("checks.md").values()
        for cell in first_cells(section)
        for span in CODE_SPAN.findall(cell)
    }
    both_ways(documented, check_ids_in_package(), "checks.md")


# -- metrics ---------------------------------------------------------------------
def test_every_metric_is_in_metrics_md(r):
    # A real scrape: the process's counters and histogram on a registry of
    # their own, and the queue gauges read from the private Redis.
    from prometheus_client import CollectorRegistry

    from echomq_django import EchoMQ
    from echomq_django.monitoring.metrics import ProcessMetrics, QueueCollector

    registry = CollectorRegistry()
    ProcessMetrics(registry=registry)
    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("docs", "docs.job", {})
    families = [*registry.collect(), *QueueCollector(mq, ["docs"]).collect()]
    # the exposition names a counter <name>_total
    in_code = {f.name + ("_total" if f.type == "counter" else ""): f.type for f in families}
    rows = {}
    for line in sections("metrics.md")[""].splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if cells and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = cells[1]
    both_ways(set(rows), set(in_code), "metrics.md")
    wrong_type = sorted(n for n in rows if rows[n] != in_code[n])
    assert wrong_type == [], "metrics.md gives another type than the code"


# -- the stats document -------------------------------------------------------------
def test_every_stats_field_is_in_stats_md(r):
    from echomq_django import EchoMQ
    from echomq_django.monitoring.stats import collect
    from echomq_django.protocol.presence import ProcessInfo
    from echomq_django.runners.periodic import Entry, Scheduler

    mq = EchoMQ(r, prefix="emq")
    mq.enqueue("docs", "docs.job", {})
    mq.enqueue("docs", "docs.job", {}, group="tenant")
    doc = collect(mq, ["docs"])
    schedule = Scheduler(mq, [Entry(key="tick", name="docs.job", queue="docs", every_s=60)])
    page = sections("stats.md")
    assert doc["schema"] == "echomq.stats/1"
    both_ways(names(page["Top level"]), set(doc), "stats.md, Top level")
    both_ways(names(page["queues"]), set(doc["queues"]["docs"]), "stats.md, queues")
    both_ways(
        names(page["processes"]),
        {f.name for f in dataclasses.fields(ProcessInfo)},
        "stats.md, processes",
    )
    both_ways(names(page["schedule"]), set(schedule.state()[0]), "stats.md, schedule")
    group = doc["queues"]["docs"]["groups"]["tenant"]
    both_ways(names(page["groups"]), set(group), "stats.md, groups")


# -- the Python API ----------------------------------------------------------------
def test_every_public_name_is_in_api_md():
    import echomq_django

    text = (REFERENCE / "api.md").read_text()
    documented = set(re.findall(r"^\.\. auto\w+:: echomq_django\.(\w+)$", text, re.MULTILINE))
    both_ways(documented, set(echomq_django.__all__), "api.md")
    assert ".. autoclass:: echomq_django.tasks.EchoMQBackend" in text
