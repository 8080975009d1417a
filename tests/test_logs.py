"""Logging by Django's convention (echomq_django.logs):
loggers under ``echomq_django.*``, no handler added when the project's
logging prints our lines already, no line twice, ``--verbosity`` sets
levels on our loggers only."""

from __future__ import annotations

import io
import logging
import logging.config

import pytest

from echomq_django.logs import setup_logging

NAMES = ("", "echomq_django", "echomq_django.worker", "echomq_django.pump", "django")


@pytest.fixture(autouse=True)
def _restore_logging():
    saved = {
        n: (lg.level, list(lg.handlers), lg.propagate)
        for n in NAMES
        for lg in [logging.getLogger(n)]
    }
    for n in NAMES:
        lg = logging.getLogger(n)
        lg.handlers = []
        lg.setLevel(logging.NOTSET if n else logging.WARNING)
    yield
    for n, (level, handlers, propagate) in saved.items():
        lg = logging.getLogger(n)
        lg.setLevel(level)
        lg.handlers = handlers
        lg.propagate = propagate


def project_logging(loggers: dict | None = None) -> io.StringIO:
    """dictConfig as a project's LOGGING would: a root handler to a buffer."""
    out = io.StringIO()
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "handlers": {"buf": {"class": "logging.StreamHandler", "stream": out}},
            "root": {"handlers": ["buf"], "level": "INFO"},
            "loggers": loggers or {},
        }
    )
    return out


def test_a_root_handler_prints_each_line_once_and_we_add_none():
    out = project_logging()
    setup_logging(1)
    setup_logging(1)
    assert logging.getLogger("echomq_django").handlers == []
    logging.getLogger("echomq_django.worker").info("processed 3 jobs")
    assert out.getvalue() == "processed 3 jobs\n"


def test_without_any_handler_one_is_added_once():
    # (pytest keeps handlers on the root logger while a test runs: cut it off)
    logging.getLogger("echomq_django").propagate = False
    setup_logging(1)
    setup_logging(2)
    [handler] = logging.getLogger("echomq_django").handlers
    assert handler.stream is not None


def test_verbosity_sets_our_loggers_only():
    project_logging(loggers={"django": {"level": "ERROR"}})
    root_level = logging.getLogger().level
    setup_logging(3, runner="echomq_django.pump")
    assert logging.getLogger("echomq_django").level == logging.DEBUG
    assert logging.getLogger("echomq_django.pump").level == logging.DEBUG
    assert logging.getLogger().level == root_level == logging.INFO
    assert logging.getLogger("django").level == logging.ERROR


@pytest.mark.parametrize(
    "verbosity,expected",
    [(1, (logging.WARNING, logging.ERROR)), (0, (logging.WARNING, logging.WARNING))],
)
def test_the_projects_levels_are_kept_at_the_default_verbosity(verbosity, expected):
    project_logging(
        loggers={
            "echomq_django": {"level": "WARNING"},
            "echomq_django.worker": {"level": "ERROR"},
        }
    )
    setup_logging(verbosity)
    lib, worker = logging.getLogger("echomq_django"), logging.getLogger("echomq_django.worker")
    assert (lib.level, worker.level) == expected


def test_levels_at_each_verbosity_when_the_project_sets_none():
    seen = []
    for verbosity in (0, 1, 2, 3):
        for n in ("echomq_django", "echomq_django.worker"):
            logging.getLogger(n).setLevel(logging.NOTSET)
        setup_logging(verbosity)
        seen.append(
            (
                logging.getLogger("echomq_django").level,
                logging.getLogger("echomq_django.worker").level,
            )
        )
    assert seen == [
        (logging.WARNING, logging.WARNING),
        (logging.INFO, logging.INFO),
        (logging.INFO, logging.DEBUG),
        (logging.DEBUG, logging.DEBUG),
    ]
