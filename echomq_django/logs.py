"""Logging set-up for the runner commands (``runworker``, ``runpump``): their
``--verbosity`` as log levels (cf. arq's ``logs.py``). A module of
its own so that no command imports another.
"""

from __future__ import annotations

import logging
import sys

# --verbosity -> (level of the runner's logger, level of the rest of echomq_django)
LEVELS = {
    0: (logging.WARNING, logging.WARNING),
    1: (logging.INFO, logging.INFO),
    2: (logging.DEBUG, logging.INFO),
    3: (logging.DEBUG, logging.DEBUG),
}
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


DEFAULT_VERBOSITY = 1  # Django's own default for --verbosity


def setup_logging(verbosity: int, runner: str = "echomq_django.worker") -> None:
    """0: warnings; 1: + the runner's periodic summary line; 2: + the
    runner's per-item lines (a line per job, per sweep); 3: debug everywhere.
    ``runner`` is the logger name of the command's runner.

    Django's convention: levels are set on ``echomq_django`` and
    the runner's logger only, never on the root or another library's
    logger; at the default verbosity (1) a level the project's ``LOGGING``
    gave one of them is kept. A stderr handler is added to ``echomq_django``
    only when nothing would print its records otherwise (no handler on it
    nor on an ancestor it propagates to), so a project that logs through a
    root handler sees every line once."""
    runner_level, lib_level = LEVELS.get(verbosity, LEVELS[3])
    for name, level in (("echomq_django", lib_level), (runner, runner_level)):
        logger = logging.getLogger(name)
        if verbosity != DEFAULT_VERBOSITY or logger.level == logging.NOTSET:
            logger.setLevel(level)
    lib = logging.getLogger("echomq_django")
    if not lib.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        lib.addHandler(handler)
