"""Settings of the fault suite's worker and pump processes
(tests/faults/test_chaos.py): the test project's, plus the ``fault.*``
handlers, the Redis from ``ECHOMQ_URL`` (a Cluster when ``ECHOMQ_CLUSTER``
is ``1``) and short leases, so a SIGKILLed worker's jobs come back soon."""

import os

from testproject.settings import *  # noqa: F403
from testproject.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.support.faultapp"]
FAULT_QUEUES = ("fa", "fb", "fc")
ECHOMQ = {
    "URL": os.environ["ECHOMQ_URL"],
    "CLUSTER": os.environ.get("ECHOMQ_CLUSTER") == "1",
    "PREFIX": "emq",
    "QUEUES": {
        q: {
            **{"LEASE_MS": 1500, "MAX_ATTEMPTS": 2, "BACKOFF_MS": 20},
            **{"KEEP_COMPLETED": 100_000, "KEEP_DEAD": 100_000},  # the audit reads every row
        }
        for q in FAULT_QUEUES
    },
}
