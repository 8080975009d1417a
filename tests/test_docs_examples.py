"""The docs' examples run (docs/examples/, included by the tutorial and the
how-to pages): every Python file there is imported or run here against the
suite's private Redis, and the shell snippets are checked for what can be
checked. A page's example that breaks fails here, not in a reader's project.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.test import override_settings

import echomq_django as emq
from echomq_django import conf

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
TUTORIAL = EXAMPLES / "tutorial"
HOWTO = EXAMPLES / "howto"
DEPLOY = EXAMPLES / "deploy"


def snippet_settings(path: Path, **names) -> dict:
    """The names a settings snippet defines, run with ``names`` predefined."""
    scope = dict(names)
    exec(compile(path.read_text(), str(path), "exec"), scope)
    return scope


@pytest.fixture
def examples_on_path(monkeypatch):
    """docs/examples/tutorial on sys.path, as the tutorial's project root is."""
    monkeypatch.syspath_prepend(str(TUTORIAL))


@pytest.fixture
def tutorial_site(r, redis_server, examples_on_path):
    """The tutorial's ECHOMQ (from its settings snippet) on the private Redis,
    its handlers registered, an empty Redis."""
    scope = snippet_settings(TUTORIAL / "settings_snippet.py", INSTALLED_APPS=[])
    assert scope["INSTALLED_APPS"] == ["echomq_django", "wordcount"]
    import wordcount.jobs  # noqa: F401  (registers the handlers, as autodiscovery does)

    with override_settings(ECHOMQ=scope["ECHOMQ"]):
        conf.reset()
        assert conf.problems() == []
        yield scope["ECHOMQ"]
    conf.reset()


def burst(*queues: str, concurrency: int = 2) -> emq.Worker:
    worker = emq.Worker(list(queues), concurrency=concurrency, register=False)
    worker.run(burst=True)
    return worker


@contextmanager
def echomq_settings(**cfg):
    """``ECHOMQ`` = ``cfg`` (URL: the private server unless given), a fresh
    client from it, and the suite's settings back afterwards."""
    cfg.setdefault("URL", os.environ["ECHOMQ_URL"])
    with override_settings(ECHOMQ=cfg):
        conf.reset()
        assert conf.problems() == []
        try:
            yield conf.get_mq()
        finally:
            conf.reset()


@pytest.fixture
def howto(r, monkeypatch):
    """Imports a how-to example by its file name, on an empty Redis."""
    monkeypatch.syspath_prepend(str(HOWTO))
    return importlib.import_module


def test_every_python_example_parses_and_lives_under_examples():
    files = sorted(EXAMPLES.rglob("*.py"))
    assert files, "docs/examples/ holds the pages' Python examples"
    for path in files:
        ast.parse(path.read_text(), str(path))


def test_the_tutorial_flow_runs_its_parent_on_the_childrens_results(tutorial_site):
    from wordcount.flows import count_words

    ref = count_words(1, ["the quick brown fox", "jumps over", "the lazy dog"])
    assert (ref.parent_id, ref.landed, len(ref.child_ids)) == ("report-1", 4, 3)
    assert emq.get_job("reports", "report-1").state == "awaiting_children"
    # the worker runs the children, delivers their completions to the parent
    # on another queue itself, and runs the parent; the pump finds nothing left
    assert burst("counting", "reports").processed == 4
    report = emq.Pump(["counting", "reports"]).sweep()
    assert report["counting"]["delivered"] == 0
    job = emq.get_job("reports", "report-1")
    assert (job.state, job.result) == ("completed", {"documents": 3, "words": 9})
    assert sorted(r["words"] for r in emq.children_values("reports", "report-1").values()) == [
        2,
        3,
        4,
    ]


def test_the_testing_howto_example_passes_under_pytest(redis_server):
    """docs/examples/howto/testing_handlers.py is a test module a reader
    copies: run it as they would, in its own pytest, on the tutorial's
    settings (it starts its own private redis-server)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TUTORIAL), str(REPO)])}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds",
            "tutorial_settings",
            str(EXAMPLES / "howto" / "testing_handlers.py"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


# -- how-to pages ------------------------------------------------------------


def test_the_cluster_howto_runs_the_tutorial_flow_on_a_cluster(
    redis_cluster, rc, examples_on_path, monkeypatch
):
    cfg = snippet_settings(HOWTO / "cluster_settings.py")["ECHOMQ"]
    assert cfg["CLUSTER"] is True
    import wordcount.jobs  # noqa: F401
    from wordcount.flows import count_words

    monkeypatch.setenv("ECHOMQ_URL", redis_cluster.url)  # the node the page's URL stands for
    with echomq_settings(**{**cfg, "URL": redis_cluster.url}) as mq:
        count_words(2, ["a b c", "d"])
        burst("counting", "reports")
        emq.Pump(["counting", "reports"]).sweep()
        burst("counting", "reports")
        job = mq.get_job("reports", "report-2")
        assert (job.state, job.result) == ("completed", {"documents": 2, "words": 4})


@pytest.mark.django_db(transaction=True)
def test_durable_enqueue_lands_after_the_commit_and_not_after_a_rollback(howto):
    from django.contrib.auth.models import User

    example = howto("durable_enqueue")
    with echomq_settings(QUEUES={"mail": {}}) as mq:
        user, job_id = example.sign_up("ada", "ada@example.org")
        job = mq.get_job("mail", job_id)
        assert (job.state, job.payload) == ("pending", {"user": user.pk})
        with pytest.raises(ValueError, match="invalid after all"):
            example.sign_up_then_fail("bob")
        assert list(User.objects.values_list("username", flat=True)) == ["ada"]
        assert mq.counts("mail")["pending"] == 1
        from echomq_django.models import OutboxEntry

        assert OutboxEntry.objects.count() == 0  # pushed, and its row deleted


def test_the_periodic_howto_schedule_passes_the_checks_and_lists_its_entries(howto):
    from echomq_django.checks import check_scheduling
    from echomq_django.runners.periodic import Scheduler

    example = howto("periodic")
    with echomq_settings(SCHEDULE=example.SCHEDULE) as mq:
        assert check_scheduling() == []
        state = {e["entry"]: e for e in Scheduler(mq).state()}
        assert sorted(state) == ["heartbeat", "nightly-report"]
        assert (state["heartbeat"]["queue"], state["nightly-report"]["name"]) == (
            "ops",
            "reports.nightly",
        )
        # a first start fires no past tick: the pump's first sweep adds nothing
        assert emq.Pump(["ops", "reports"]).sweep()["ops"]["scheduled"] == 0
        row = example.follow_customer(42, every_s=60)
        assert (row["entry"], row["queue"], row["payload"]) == ("sync-42", "ops", {"customer": 42})
        listed = [(r["entry"], r["read_only"]) for r in emq.schedules.list()]
        assert listed == [("nightly-report", True), ("heartbeat", True), ("sync-42", False)]
        assert (example.unfollow_customer(42), example.unfollow_customer(42)) == (True, False)


def test_the_retention_howto_settings_pass_and_keep_zero_goes_at_the_next_sweep(
    howto, tutorial_site
):
    example = howto("retention")
    cfg = dict(example.ECHOMQ)
    del cfg["URL"]

    @emq.handler("mail.receipt")
    def receipt(job):
        return "sent"

    with echomq_settings(**cfg):
        job_id = example.send_receipt(7)
        ref = example.start_report(7)
        burst("mail")
        assert emq.get_job("mail", job_id).state == "completed"
        emq.Pump(["mail"]).sweep()
        with pytest.raises(emq.JobNotFound):
            emq.get_job("mail", job_id)
        assert emq.get_job("reports", ref.parent_id).state == "awaiting_children"


def test_the_cancel_and_remove_howto(howto, tutorial_site):
    from wordcount.flows import count_words

    example = howto("cancel_remove")
    ref = count_words(5, ["one", "two"])
    assert example.cancel_report(5) == "awaiting_children"
    job = emq.get_job("reports", "report-5")
    assert (job.state, job.error) == ("dead", "cancelled")
    assert [emq.get_job("counting", i).state for i in ref.child_ids] == ["dead", "dead"]
    assert example.cancel_report(5) == "finished"
    # the parent's row; the children on another slot go through the
    # outbox, delivered before remove returns (not counted in ``removed``)
    assert example.forget_report(5) == 1
    for child in ref.child_ids:
        with pytest.raises(emq.JobNotFound):
            emq.get_job("counting", child)
    assert example.cancel_report(5) is None
    from types import SimpleNamespace

    assert example.export(SimpleNamespace(payload={"chunks": 3}, cancelled=False)) == {
        "exported": 3
    }
    assert example.export(SimpleNamespace(payload={"chunks": 3}, cancelled=True)) == {
        "stopped_after": 0
    }


def test_the_flow_failed_receiver_hears_a_failed_report_once(howto, tutorial_site):
    from django.core.cache import cache
    from wordcount.flows import count_words

    example = howto("flow_failed")
    try:
        count_words(6, ["fine", None])  # None: "text" has no split(), the child dies
        for _ in range(3):  # the child's MAX_ATTEMPTS is 3; a zero backoff makes each due now
            with echomq_settings(QUEUES={"counting": {"BACKOFF_MS": 0, "MAX_ATTEMPTS": 3}}):
                burst("counting")
        emq.Pump(["counting", "reports"]).sweep()
        assert emq.get_job("reports", "report-6").state == "dead"
        emq.Dispatcher(["reports"]).dispatch_all()
        emq.Dispatcher(["reports"]).dispatch_all()  # nothing new: sent once
        got = cache.get("report-failed:report-6")
        assert got["error"].startswith("failed by child ")
        assert "AttributeError" in got["error"]
        assert got["event"].startswith("reports:")
    finally:
        from echomq_django.signals import flow_failed

        flow_failed.disconnect(example.remember_failed_report)
        cache.delete("report-failed:report-6")


def test_the_priorities_howto(howto):
    example = howto("priorities")
    ran = []
    for name in ("mail.newsletter", "mail.password_reset", "mail.digest"):
        emq.handler(name)(lambda job, name=name: ran.append(name))
    with echomq_settings(QUEUES=example.QUEUES):
        example.add_mail()
        burst("mail", concurrency=1)
        assert ran == ["mail.password_reset", "mail.newsletter", "mail.digest"]
        first = example.add_digest(42)
        assert example.add_digest(42) == first
        job_id = emq.enqueue("api", "api.call", {"throttle": True})
        worker = burst("api", concurrency=1)
        assert worker.stats["postponed"] == 1
        job = emq.get_job("api", job_id)
        assert (job.state, job.attempts) == ("delayed", 0)
        ref = example.fulfil_order(9)
        assert (ref.parent_id, ref.landed) == ("order-9", 5)
        assert emq.dependency_counts("orders", "order-9")["remaining"] == 4
        assert example.ease_off_partner() == 1
        for i in range(3):
            emq.enqueue("partner", "api.call", {"n": i}, job_id=f"p{i}")
        partner = conf.get_mq()
        assert len(partner.claim("partner", 3)) == 1  # one at a time, for every worker
        assert partner.claim("partner", 3).full
        assert example.partner_recovered() == 3
        assert len(partner.claim("partner", 3)) == 2  # the setting's 3, one running


def test_the_fair_queues_howto(howto):
    example = howto("fair_queues")
    ran = howto("fair_queues_jobs").DONE  # the page's handlers, as its jobs.py holds them
    with echomq_settings(QUEUES=example.QUEUES) as mq:
        assert len(example.import_rows(1, [{"row": i} for i in range(5)])) == 5
        example.reset_password(2, 42)
        burst("tenant", concurrency=1)
        # the reset runs in the second turn, not after the 5 rows
        assert ran[:3] == [
            ("tenant.import_row", {"row": 0}),
            ("tenant.reset_password", {"user": 42}),
            ("tenant.import_row", {"row": 1}),
        ]
        assert len(ran) == 6
        assert example.give_more_room(1) == 5
        assert example.hold(1) is True
        example.import_rows(1, [{"row": 9}])
        assert burst("tenant", concurrency=1).processed == 0  # held: nothing starts
        assert mq.groups.counts("tenant")["customer-1"]["pending"] == 1
        assert example.release(1) is True
        assert burst("tenant", concurrency=1).processed == 1


def test_the_sentinel_howto_settings_pass_the_checks_and_name_the_master(no_env_url):
    from redis.sentinel import SentinelConnectionPool

    scope = snippet_settings(HOWTO / "sentinel_settings.py")
    for cfg in (scope["ECHOMQ"], {"URL": scope["SENTINEL_URL"]}):
        assert conf.problems(cfg) == []
        pool = conf.build_client(cfg).connection_pool  # connects to nothing yet
        assert isinstance(pool, SentinelConnectionPool)
        assert pool.service_name == "mymaster"
        hosts = [
            c.connection_pool.connection_kwargs["host"] for c in pool.sentinel_manager.sentinels
        ]
        assert hosts == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


@pytest.mark.django_db(transaction=True)
def test_the_async_handler_howto(howto):
    from asgiref.sync import async_to_sync
    from django.contrib.auth.models import User

    example = howto("async_handlers")
    user = User.objects.create(username="grace")
    with echomq_settings(QUEUES={"mail": {}}):
        job_id = async_to_sync(example.greet_later)(user.pk)
        burst("mail")
        assert emq.get_job("mail", job_id).result == {"greeted": "grace"}


def test_the_payloads_howto(howto):
    import datetime
    import decimal
    import uuid

    example = howto("payloads")
    invoice = uuid.UUID("12345678-1234-5678-1234-567812345678")
    args = (invoice, decimal.Decimal("12.50"), datetime.date(2000, 1, 31))
    with echomq_settings(QUEUES={"billing": {}}):
        with pytest.raises(emq.PayloadError):
            example.bill(*args)  # without the encoder: refused before any write
    cfg = dict(example.ECHOMQ)
    del cfg["URL"]
    with echomq_settings(**cfg) as mq:
        job_id = example.bill(*args)
        assert mq.get_job("billing", job_id).payload == {
            "invoice": str(invoice),
            "amount": "12.50",
            "due": "2000-01-31",
        }
        burst("billing")
        assert mq.get_job("billing", job_id).result == {
            "invoice": str(invoice),
            "cents": 1250,
            "late": True,
        }


def test_the_tasks_backend_howto(howto):
    example = howto("tasks_example")
    scope = snippet_settings(HOWTO / "tasks_settings.py", INSTALLED_APPS=[])
    backend = scope["TASKS"]["default"]
    assert backend["BACKEND"] == "echomq_django.tasks.EchoMQBackend"
    assert set(backend["OPTIONS"]) == {"MAX_ATTEMPTS", "ON_COMMIT"}
    with echomq_settings():
        result = example.add_numbers.enqueue(2, 3)
        shout = example.shout.enqueue("hi")
        burst("default")
        assert example.add_numbers.get_result(result.id).return_value == 5
        assert example.shout.get_result(shout.id).return_value == "HI"
        assert emq.get_job("default", shout.id).priority == 10


def test_the_migrate_howto(howto):
    example = howto("migrate.echomq_flow")
    with echomq_settings():
        ref = example.count_words(["a b", "c d e"])
        burst("default")
        assert emq.get_job("default", ref.parent_id).result == 5
        delayed = example.notify_later(1)
        assert emq.get_job("default", delayed).state == "delayed"


def test_the_logging_howto_keeps_its_levels_under_runworker():
    """The page's LOGGING, then what runworker does at the default
    verbosity: the levels it gave stay, and no second handler is added."""
    code = (
        "import logging, logging.config, runpy\n"
        f"ns = runpy.run_path({str(HOWTO / 'logging_settings.py')!r})\n"
        "logging.config.dictConfig(ns['LOGGING'])\n"
        "from echomq_django.logs import setup_logging\n"
        "setup_logging(1)\n"
        "lib = logging.getLogger('echomq_django')\n"
        "print(logging.getLogger('echomq_django.worker').level, len(lib.handlers), lib.level)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.stdout.split() == ["10", "1", "20"], done.stderr


# -- the deployment files ----------------------------------------------------


def unit(path: Path) -> dict[str, dict[str, str]]:
    """An ini-style file (a systemd unit, a supervisor config) as
    ``{section: {key: value}}``; a key systemd allows again (``Environment``)
    keeps its values joined by newlines."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None and "=" in line, (path.name, line)
        key, value = (part.strip() for part in line.split("=", 1))
        current[key] = f"{current[key]}\n{value}" if key in current else value
    return sections


@pytest.mark.parametrize("name", ["echomq-worker.service", "echomq-pump.service"])
def test_the_systemd_units_restart_with_a_delay_and_stop_gracefully(name):
    service = unit(DEPLOY / name)["Service"]
    assert (service["Restart"], service["RestartSec"], service["KillSignal"]) == (
        "always",
        "5",
        "SIGTERM",
    )
    command = "runworker" if "worker" in name else "runpump"
    assert f"manage.py {command} counting reports" in service["ExecStart"]
    assert "--no-wait" not in service["ExecStart"]  # a service waits for Redis
    if command == "runworker":  # longer than --shutdown-timeout's 30 s
        assert int(service["TimeoutStopSec"]) > 30


def test_the_supervisor_and_compose_files_run_both_processes():
    programs = unit(DEPLOY / "supervisord.conf")
    assert {s: programs[s]["command"].split()[2] for s in programs} == {
        "program:mysite-worker": "runworker",
        "program:mysite-pump": "runpump",
    }
    assert int(programs["program:mysite-worker"]["stopwaitsecs"]) > 30
    compose = (DEPLOY / "docker-compose.yml").read_text()
    commands = re.findall(r"command: python manage.py (\w+)", compose)
    assert commands == ["runworker", "runpump"]
    assert "stop_grace_period: 40s" in compose
    procfile = dict(line.split(": ", 1) for line in (DEPLOY / "Procfile").read_text().splitlines())
    assert sorted(procfile) == ["pump", "web", "worker"]


def test_the_commands_the_pages_use_exist_with_their_flags():
    """Every ``manage.py <command> --flag`` in the tutorial, the how-tos and
    the deploy files names a real command and flag."""
    from django.core.management import get_commands, load_command_class

    pages = [*(REPO / "docs" / "tutorial").glob("*.md"), *(REPO / "docs" / "howto").glob("*.md")]
    pages += [p for p in DEPLOY.iterdir() if p.is_file()]
    seen = set()
    for page in pages:
        for command, rest in re.findall(r"manage\.py (run\w+)([^\n`]*)", page.read_text()):
            flags = set(re.findall(r"(--[a-z][a-z-]*)", rest))
            seen.add(command)
            parser = load_command_class(get_commands()[command], command).create_parser(
                "manage.py", command
            )
            known = {o for a in parser._actions for o in a.option_strings}
            assert flags <= known, (page.name, command, flags - known)
    assert {"runworker", "runpump"} <= seen


# -- the pages themselves ----------------------------------------------------

PAGES = sorted(
    [*(REPO / "docs" / "tutorial").glob("*.md"), *(REPO / "docs" / "howto").glob("*.md")]
)


# the reference pages another part of the site provides (docs/index.md globs them)
def slugs(page: Path) -> set[str]:
    """The heading anchors MyST gives ``page`` (``myst_heading_anchors``),
    GitHub's way: lower case, punctuation dropped, spaces to dashes."""
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            found.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return found


def test_the_pages_links_and_includes_resolve():
    assert [p.name for p in PAGES if p.parent.name == "howto"] == sorted(
        f"{n}.md"
        for n in [
            "async-handlers",
            "cancel-remove",
            "canvas",
            "cluster",
            "deploy",
            "durable-enqueue",
            "events",
            "fair-queues",
            "logging",
            "metrics-alerts",
            "migrate",
            "operate",
            "operate-workers",
            "read-flows",
            "payloads",
            "periodic",
            "priorities-rate-limits",
            "progress-and-logs",
            "process-pool",
            "retention",
            "sentinel",
            "retries",
            "step-jobs",
            "tasks-backend",
            "testing",
            "tracing",
            "wait",
        ]
    )
    checked = {"links": 0, "anchors": 0, "includes": 0}
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#\s]*)(?:#[^)]*)?\)", text):
            if target.startswith("http") or not target:
                continue
            path = (page.parent / target).resolve()
            assert path.is_file(), (page.name, target)
            checked["links"] += 1
        for target, anchor in re.findall(r"\]\(([^)#\s]*\.md)#([^)]+)\)", text):
            path = (page.parent / target).resolve()
            assert anchor in slugs(path), (page.name, target, anchor)
            checked["anchors"] += 1
        for include, options in re.findall(r"```\{literalinclude\} (\S+)\n((?::.*\n)*)", text):
            path = page.parent / include
            assert path.is_file(), (page.name, include)
            checked["includes"] += 1
            for obj in re.findall(r":pyobject: (\w+)", options):
                tree = ast.parse(path.read_text())
                assert obj in {getattr(n, "name", None) for n in tree.body}, (page.name, obj)
            for mark in re.findall(r':(?:start|end)-at: "(.+)"', options):
                assert mark in path.read_text(), (page.name, include, mark)
    assert min(checked["links"], checked["includes"]) >= 20 and checked["anchors"] >= 3, checked


def test_the_alert_rules_name_only_metrics_the_reference_lists():
    """docs/howto/metrics-alerts.md: every ``echomq_*`` metric in the
    Prometheus files exists (a histogram's ``_bucket`` series counts as its
    own name), and the rules cover the gauges a site pages on."""
    listed = set(
        re.findall(
            r"^\| `(echomq_\w+)`", (REPO / "docs" / "reference" / "metrics.md").read_text(), re.M
        )
    )
    used = set()
    for name in ("echomq-alerts.yml", "prometheus.yml"):
        text = (HOWTO / name).read_text()
        used |= {re.sub(r"_bucket$", "", m) for m in re.findall(r"\b(echomq_(?!django)\w+)", text)}
    assert sorted(used - listed) == []
    assert {"echomq_redis_up", "echomq_processes_live", "echomq_jobs_dead_total"} <= used


def test_the_read_flows_howto(howto):
    example = howto("read_flows")
    with echomq_settings():
        ref = example.add_report("r1", [5, 7, 11], failing=[1])
        assert ref.ref == emq.JobRef("reports", "r1")
        burst("lines")
        emq.Pump(["lines", "reports"]).sweep()  # the children's outcomes reach the parent
        burst("reports")
        job = emq.get_job("reports", "r1")
        assert (job.state, job.result) == (
            "completed",
            {
                "total": 16,
                "lines": ["lines/r1-line-0", "lines/r1-line-2"],
                "skipped": ["lines/r1-line-1"],
            },
        )
        every = example.all_children_values("reports", "r1", page_size=1)
        assert every == {emq.JobRef("lines", "r1-line-0"): 5, emq.JobRef("lines", "r1-line-2"): 11}
        assert example.refs_demo() == [
            "lines/r1-line-0",
            "lines",
            "r1-line-0",
            True,
            ("lines", "r1-line-0"),
        ]


def test_the_wait_howto(howto):
    """The view answers the job's result once a worker ran it; a job that
    dies answers 502 with its error; one not run in time answers 202."""
    import asyncio
    import json
    import threading

    from django.test import RequestFactory

    example = howto("wait")
    request = RequestFactory().get("/quote")
    with echomq_settings():
        # a short block: a waker thread that a stop races past its cut
        # returns within it instead of lingering into later tests
        worker = emq.Worker(["quotes"], register=False, block_timeout=0.5)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            reply = example.quote(request, "sku-1")
            assert (reply.status_code, json.loads(reply.content)) == (
                200,
                {"sku": "sku-1", "price_cents": 4200},
            )
            reply = example.quote(request, "discontinued")
            assert reply.status_code == 502
            assert json.loads(reply.content)["error"] == (
                "Unrecoverable: no price for a discontinued item"  # the headline, no traceback
            )
            reply = asyncio.run(example.aquote(request, "sku-3"))
            assert json.loads(reply.content) == {"sku": "sku-3", "price_cents": 4200}
        finally:
            worker.stop()
            thread.join(30)
        reply = example.quote(request, "sku-2")  # no worker now: not finished in 2 s
        assert (reply.status_code, json.loads(reply.content)["state"]) == (202, "running")


def test_the_canvas_howto(howto):
    """The checkout lands as one flow (3 price lines, a total, tax, the
    receipt) and its receipt is the chain's last result."""
    example = howto("canvas")
    with echomq_settings() as mq:
        ref = example.checkout("o7", {"book": 2, "pen": 4, "lamp": 1})
        assert ref == emq.JobRef("orders", "receipt-o7")
        assert mq.dependency_counts("orders", "receipt-o7")["children"] == 1
        for _ in range(8):  # the prices' results cross to `orders` through the pump
            burst("prices", "orders")
            emq.Pump(["prices", "orders"]).sweep()
        assert example.receipt_of(ref) == {"order": "o7", "due_cents": round(6400 * 1.2)}


def test_the_progress_and_logs_howto(howto):
    """The handler's progress and lines are read back by the status view;
    report_step reaches the running job through current_job()."""
    import json

    from django.test import RequestFactory

    from echomq_django.core.live import running, stop_running

    example = howto("progress_logs")
    request = RequestFactory().get("/status")
    images = [f"img{n}.png" for n in range(7)]
    with echomq_settings(QUEUES={"media": {"KEEP_LOGS": 5}}) as mq:
        emq.enqueue("media", "media.thumbnails", {"images": images}, job_id="t1")
        assert burst("media").processed == 1
        reply = example.status(request, "no-such-job")
        assert (reply.status_code, json.loads(reply.content)) == (404, {"state": None})
        reply = example.status(request, "t1")
        assert json.loads(reply.content) == {
            "state": "completed",
            "progress": {"stage": "done", "images": 7},
            "log": [f"resized img{n}.png" for n in range(2, 7)],  # KEEP_LOGS = 5
        }
        example.report_step("outside a worker", 10)  # no current job: nothing to do
        emq.enqueue("media", "media.other", None, job_id="t2")
        (job,) = mq.claim("media")
        token = running(job)
        try:
            example.report_step("step one", 30)
        finally:
            stop_running(token)
        assert (emq.get_job("media", "t2").progress, emq.job_logs("media/t2")) == (
            30,
            ["step one"],
        )


def test_the_tracing_howto(howto, monkeypatch):
    """The view's request span, the add and the three jobs' attempts on two
    queues are one trace; every attempt is a child of the add."""
    import json

    from django.test import RequestFactory

    trace = pytest.importorskip("opentelemetry.trace")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.util._once import Once

    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)  # unset for this test only
    monkeypatch.setattr(trace, "_TRACER_PROVIDER_SET_ONCE", Once())
    example = howto("tracing")
    memory = InMemorySpanExporter()
    provider = example.setup_tracing(memory)
    with echomq_settings():
        reply = example.checkout(RequestFactory().post("/checkout"), 7)
        assert json.loads(reply.content)["jobs"][0] == "shipping/ship-7"
        burst("packing")
        emq.Pump(["packing", "shipping"]).sweep()
        burst("shipping")
        assert emq.get_job("shipping", "ship-7").result == {"order": 7, "items": ["book", "lamp"]}
    provider.force_flush()
    spans = {s.name: s for s in memory.get_finished_spans()}
    assert sorted(spans) == [
        "POST /checkout",
        "echomq add_flow",
        "echomq run shop.pack",
        "echomq run shop.ship",
    ]
    runs = [s for s in memory.get_finished_spans() if s.name.startswith("echomq run")]
    assert len(runs) == 3
    assert {s.context.trace_id for s in memory.get_finished_spans()} == {
        spans["POST /checkout"].context.trace_id
    }
    assert spans["echomq add_flow"].parent.span_id == spans["POST /checkout"].context.span_id
    assert {s.parent.span_id for s in runs} == {spans["echomq add_flow"].context.span_id}
    provider.shutdown()


def test_the_retries_howto(howto):
    """Timeouts are retried on the list's delays, with jitter; a declined
    card dies at its first attempt; a busy gateway's job waits exactly its
    Retry delay; a quote not started within a minute dies ``expired``; one
    job's own policy wins over its queue's."""
    from tests.support.jobkit import score
    from tests.support.workerkit import T0, Clock

    example = howto("retries")
    with echomq_settings(QUEUES=example.QUEUES) as mq:
        clock = mq.clock = Clock()

        def run(*queues):
            emq.Worker(list(queues), mq=mq, register=False).run(burst=True)

        paid = example.charge_order("o1", ["timeout", "timeout", "ok"])
        declined = example.charge_order("o2", ["declined"])
        busy = example.charge_order("o3", ["busy", "ok"])
        run("payments")
        first = mq.get_job("payments", paid)
        assert (first.state, first.attempts) == ("delayed", 1)
        assert first.error.startswith("GatewayTimeout: order o1: no answer in 10 s")
        assert T0 + 800 <= score(mq, "payments", "delayed", paid) <= T0 + 1000
        dead = mq.get_job("payments", declined)
        assert (dead.state, dead.attempts, dead.max_attempts) == ("dead", 1, 5)
        gave_up = list(example.GAVE_UP)  # its on_dead job ran in the same burst
        assert gave_up == [(f"payments/{declined}", "CardDeclined: order o2: card declined")]
        assert score(mq, "payments", "delayed", busy) == T0 + 2000
        clock.advance(2000)
        mq.timers.promote_delayed("payments")
        run("payments")
        assert mq.get_job("payments", busy).result == {"order": "o3", "charged": True}
        second = mq.get_job("payments", paid)
        assert (second.state, second.attempts) == ("delayed", 2)
        assert T0 + 2000 + 4000 <= score(mq, "payments", "delayed", paid) <= T0 + 2000 + 5000
        clock.advance(5000)
        mq.timers.promote_delayed("payments")
        run("payments")
        assert mq.get_job("payments", paid).result == {"order": "o1", "charged": True}

        quote = example.refresh("sku-1")
        clock.advance(60_000)
        run("quotes")
        expired = mq.get_job("quotes", quote)
        assert (expired.state, expired.error, expired.attempts) == ("dead", "expired", 0)

        own = example.charge_now("o4", ["timeout", "declined"])
        run("payments")
        assert score(mq, "payments", "delayed", own) == clock.now + 500  # backoff_for, no jitter
        clock.advance(500)
        mq.timers.promote_delayed("payments")
        run("payments")
        job = mq.get_job("payments", own)
        assert (job.state, job.attempts) == ("dead", 2)
        assert job.error.startswith("CardDeclined: order o4: card declined")


@pytest.mark.e2e
def test_the_process_pool_howto(howto):
    """The reports run in handler processes, not in the worker's."""
    example = howto("process_pool")
    with echomq_settings(QUEUES={"reports": {}}):
        for pages in (1, 2, 3):
            emq.enqueue("reports", "reports.render", {"pages": pages}, job_id=f"r{pages}")
        assert example.run_reports_once() == 3
        results = [emq.get_job("reports", f"r{n}").result for n in (1, 2, 3)]
    assert [r["pages"] for r in results] == [1, 2, 3]
    assert os.getpid() not in {r["pid"] for r in results}


def test_the_async_pool_howto(howto):
    """A hundred waiting coroutines at once on one loop; a blocking call
    moved to the job's slot thread."""
    example = howto("async_pool")
    with echomq_settings(QUEUES={"hooks": {}}):
        for i in range(100):
            emq.enqueue("hooks", "hooks.deliver", {"url": f"https://x/{i}", "wait_s": 0.5},
                        job_id=f"d{i}")  # fmt: skip
        emq.enqueue("hooks", "hooks.sign", {"body": "abc"}, job_id="s")
        assert example.run_hooks_once() == 101
        assert emq.get_job("hooks", "d7").result == {"url": "https://x/7", "status": 200}
        assert emq.job_logs("hooks", "d7") == ["delivered to https://x/7"]
        assert emq.get_job("hooks", "s").result == 294


def test_the_operate_workers_howto(howto):
    """A worker grows on command and drains, its reply as the page says."""
    from tests.support.workerkit import Background, wait_for

    example = howto("operate_workers")
    with echomq_settings(QUEUES={"reports": {}}) as mq:
        worker = emq.Worker(["reports"], concurrency=2, block_timeout=0.5)
        bg = Background(worker)
        wait_for(lambda: worker.waiting, what="the worker idle")
        reply = example.grow(worker.process_id, 2)
        assert (reply["state"], reply["detail"]) == ("done", "2 -> 4 handlers")
        assert worker.loop.concurrency == 4
        example.drain_every_worker()
        assert bg.join() == 0
        assert mq.presence.live_processes() == []


def test_the_readme_example_is_the_file_the_suite_runs(r):
    """README.md's twenty lines are docs/examples/readme_example.py, and
    they run: the receipt completes on its two charges' results."""
    path = EXAMPLES / "readme_example.py"
    assert f"```python\n{path.read_text()}```" in (REPO / "README.md").read_text()
    with echomq_settings():
        runpy_globals = {"__name__": "readme_example"}
        exec(compile(path.read_text(), str(path), "exec"), runpy_globals)
        burst("payments")
        emq.Pump(["payments", "orders"]).sweep()
        burst("orders")
        job = emq.get_job("orders", "receipt-42")
        assert (job.state, job.result) == ("completed", {"order": 42, "total": 42})


def sse_frames(response, n: int) -> list[tuple[str, str, dict]]:
    """The next ``n`` server-sent events of a streaming response, as
    ``(id, event, data)``; keep-alive comments are skipped."""
    frames = []
    for chunk in response.streaming_content:
        text = chunk.decode()
        if text.startswith(":"):
            continue
        lines = dict(line.split(": ", 1) for line in text.strip().splitlines())
        frames.append((lines["id"], lines["event"], json.loads(lines["data"])))
        if len(frames) == n:
            break
    return frames


def test_the_events_howto_streams_a_job_to_a_browser(howto):
    """The SSE view sends the job's state, then its active and completed
    events (with the result) as the worker runs it, then ends; a bad
    Last-Event-ID is a 400 and an unknown job a 404."""
    from django.test import Client

    example = howto("events_sse")
    with echomq_settings(), override_settings(ROOT_URLCONF="events_sse"):
        emq.enqueue("exports", "exports.render", {"rows": 3}, job_id="x1", on_commit=False)
        client = Client()
        response = client.get("/jobs/exports/x1/events")
        assert (response.status_code, response["Content-Type"]) == (200, "text/event-stream")
        assert sse_frames(response, 1)[0][1:] == ("state", {"state": "pending"})
        burst("exports")
        (active, completed) = sse_frames(response, 2)
        assert active[1:] == ("active", {"job": "x1"})
        assert completed[1:] == (
            "completed",
            {"job": "x1", "result": {"rows": 3, "url": "/exports/x1.csv"}},
        )
        assert list(response.streaming_content) == []  # finished: the stream ended
        again = client.get("/jobs/exports/x1/events", HTTP_LAST_EVENT_ID=active[0])
        assert sse_frames(again, 1)[0][1:] == ("state", {"state": "completed"})
        bad = client.get("/jobs/exports/x1/events", HTTP_LAST_EVENT_ID="soon")
        assert bad.status_code == 400 and b"invalid since 'soon'" in bad.content
        assert client.get("/jobs/exports/nope/events").status_code == 404
    assert example.KEEPALIVE_S > 0


def test_the_events_howto_async_view_streams_under_asgi(howto):
    """The async SSE view, through Django's async test client: the state,
    then active and completed as a worker runs the job, then the end."""
    import asyncio

    from django.test import AsyncClient

    howto("events_sse")

    async def read() -> list:
        response = await AsyncClient().get("/ajobs/exports/x2/events")
        assert response["Content-Type"] == "text/event-stream"
        frames = []
        async for chunk in response.streaming_content:
            text = chunk.decode()
            if text.startswith(":"):
                continue
            lines = dict(line.split(": ", 1) for line in text.strip().splitlines())
            frames.append((lines["event"], json.loads(lines["data"])))
            if len(frames) == 1:
                await asyncio.to_thread(burst, "exports")
        return frames

    with echomq_settings(), override_settings(ROOT_URLCONF="events_sse"):
        emq.enqueue("exports", "exports.render", {"rows": 2}, job_id="x2", on_commit=False)
        assert asyncio.run(read()) == [
            ("state", {"state": "pending"}),
            ("active", {"job": "x2"}),
            ("completed", {"job": "x2", "result": {"rows": 2, "url": "/exports/x2.csv"}}),
        ]


def test_the_step_jobs_howto(howto):
    """An order's job saves its step in its payload, moves itself to delayed
    (no attempt spent), adds its parcels on another queue as children, waits,
    and runs a third time with their tracking numbers."""
    from tests.support.jobkit import score
    from tests.support.workerkit import T0, Clock

    example = howto("step_jobs")
    with echomq_settings() as mq:
        clock = mq.clock = Clock()

        def run(*queues):
            emq.Worker(list(queues), mq=mq, register=False).run(burst=True)
            emq.Pump(list(queues), mq=mq).sweep()

        ref = emq.JobRef("orders", example.fulfil_order(7, ["a", "b"]))
        run("orders")
        job = mq.get_job(*ref)
        assert (job.state, job.attempts, job.payload["step"]) == ("delayed", 0, "ship")
        assert score(mq, "orders", "delayed", ref.id) == T0 + 50
        clock.advance(50)
        mq.timers.promote_delayed("orders")
        run("orders")
        assert mq.get_job(*ref).state == "awaiting_children"
        run("shipping", "orders")
        run("orders")
        job = mq.get_job(*ref)
        assert (job.state, job.attempts) == ("completed", 1)
        assert job.result == {"order": 7, "tracking": ["TRACK-a", "TRACK-b"]}
        assert job.payload["step"] == "done"
