"""``python -m bench.admin_page``: how long the admin takes to serve the page
of a parent with a big fan-in (the target: a 10,000-child parent's
page in under a second).

On a private redis-server and a throw-away SQLite database (migrated here),
a flow of 1 + ``--children`` same-queue nodes is added and half of its
children completed, one dies (ignored by policy), the queue is mirrored, and
a superuser's Django test client GETs the parent's admin page ``--repeat``
times (first page, then the last page of children); the median, the
slowest and the page's size are printed. The page shows 100 children and
reads a bounded window of them, so the time should not grow with the
fan-in.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.admin_page", description=__doc__)
    parser.add_argument("--children", type=int, default=10_000, help="fan-in (default 10000)")
    parser.add_argument("--repeat", type=int, default=5, help="GETs per page (default 5)")
    args = parser.parse_args(argv)

    from echomq_django.testing.redis_server import start_server

    server = start_server()
    tmp = tempfile.mkdtemp(prefix="emq-bench-admin-")
    os.environ.update(
        ECHOMQ_URL=server.url,
        ECHOMQ_DB_PATH=str(Path(tmp) / "db.sqlite3"),
        DJANGO_SETTINGS_MODULE="testproject.settings",
        DJANGO_DEBUG="0",
    )
    sys.path.insert(0, str(REPO))
    try:
        return run(args)
    finally:
        server.stop()


def run(args) -> int:
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment

    from echomq_django import Flow, conf
    from echomq_django.admin.pages import job_url
    from echomq_django.monitoring.mirror import mirror_queues

    setup_test_environment()  # the test client on ALLOWED_HOSTS' testserver
    call_command("migrate", verbosity=0)
    mq = conf.get_mq()
    kids = [Flow("bench", "b.leaf", {"i": i}, job_id=f"c{i}") for i in range(args.children)]
    kids[0] = Flow("bench", "b.leaf", {}, job_id="c0", ignore_dependency_on_failure=True)
    t0 = time.perf_counter()
    mq.add_flow(Flow("bench", "b.root", {}, job_id="root", children=kids))
    added = time.perf_counter() - t0
    done = args.children // 2
    claimed = 0
    while claimed < done:
        jobs = mq.claim("bench", min(500, done - claimed))
        claimed += len(jobs)
        first, rest = (jobs[0], jobs[1:]) if jobs[0].id == "c0" else (None, jobs)
        if first is not None:
            mq.fail(first, "ValueError: c0 is bad\nTraceback ...\nValueError: c0 is bad", dead=True)
        mq.complete_many([(j, {"i": j.id}) for j in rest])
    mirror_queues(mq, ["bench"], full=True)
    user = get_user_model().objects.create_superuser("bench", "b@example.com", None)
    client = Client()
    client.force_login(user)
    url = client.get(job_url("bench", "root")).url
    pages = -(-args.children // 100)
    print(
        f"1+{args.children} flow added in {added:.2f} s; {done} children finished; "
        f"page {url} ({pages} pages of children)"
    )
    for label, query in (("first page", ""), ("last page", f"?page={pages}")):
        times, size = [], 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            response = client.get(url + query)
            times.append(time.perf_counter() - t0)
            assert response.status_code == 200, response.status_code
            size = len(response.content)
        print(
            f"{label:>10}: median {statistics.median(times) * 1000:.0f} ms, "
            f"slowest {max(times) * 1000:.0f} ms over {args.repeat} GETs; {size / 1024:.0f} KiB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
