"""Logging set-up for the runner commands (``runworker``, ``runpump``): their
``--verbosity`` as log levels (DESIGN §8; cf. arq's ``logs.py``). A module of
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


def setup_logging(verbosity: int, runner: str = "echomq_django.worker") -> None:
    """0: warnings; 1: + the runner's periodic summary line; 2: + the
    runner's per-item lines (a line per job, per sweep); 3: debug everywhere.
    ``runner`` is the logger name of the command's runner. Adds a stderr
    handler unless the project's LOGGING already gave ``echomq_django`` one."""
    runner_level, lib_level = LEVELS.get(verbosity, LEVELS[3])
    lib = logging.getLogger("echomq_django")
    lib.setLevel(lib_level)
    logging.getLogger(runner).setLevel(runner_level)
    if not lib.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        lib.addHandler(handler)
