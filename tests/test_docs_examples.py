"""The docs' examples run (docs/examples/, included by the tutorial and the
how-to pages): every Python file there is imported or run here against the
suite's private Redis, and the shell snippets are checked for what can be
checked. A page's example that breaks fails here, not in a reader's project.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import override_settings

import echomq_django as emq
from echomq_django import conf

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "docs" / "examples"
TUTORIAL = EXAMPLES / "tutorial"


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


def burst(*queues: str) -> int:
    return emq.Worker(list(queues), concurrency=2, register=False).run(burst=True)


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
    # the worker alone runs the children; the parent, on another queue,
    # waits for the pump to deliver their completions
    assert burst("counting", "reports") == 3
    assert emq.get_job("reports", "report-1").state == "awaiting_children"
    report = emq.Pump(["counting", "reports"]).sweep()
    assert report["counting"]["delivered"] == 3
    assert burst("counting", "reports") == 1
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
