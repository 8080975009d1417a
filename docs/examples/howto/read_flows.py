"""docs/howto/read-flows.md: a parent's handler reads its children's
results by ``JobRef``; a view reads a wide parent a page at a time."""

import echomq_django as emq
from echomq_django import JobRef


@emq.handler("reports.line")
def line(job):
    if job.payload.get("fail"):
        raise emq.Unrecoverable("no such invoice")
    return job.payload["amount"]


@emq.handler("reports.total")
def total(job):
    values = job.children_values()  # {JobRef: result} of the children that completed
    ignored = job.ignored_failures()  # {JobRef: error} of optional children that died
    return {
        "total": sum(values.values()),
        "lines": sorted(str(ref) for ref in values),  # "queue/id" text
        "skipped": sorted(str(ref) for ref in ignored),
    }


def add_report(report_id: str, amounts: list[int], failing: list[int] = ()) -> emq.FlowRef:
    """A parent on ``reports`` over one child per amount on ``lines``; the
    children at the positions in ``failing`` die, and the parent ignores them."""
    children = [
        emq.Flow(
            "lines",
            "reports.line",
            {"amount": amount, "fail": i in failing},
            job_id=f"{report_id}-line-{i}",
            ignore_dependency_on_failure=True,
        )
        for i, amount in enumerate(amounts)
    ]
    return emq.add_flow(
        emq.Flow("reports", "reports.total", {}, job_id=report_id, children=children)
    )


def all_children_values(queue: str, parent_id: str, page_size: int = 500) -> dict[JobRef, object]:
    """Every completed child's result, read ``page_size`` children at a time."""
    values, cursor = {}, 0
    while True:
        page = emq.children_values(queue, parent_id, cursor=cursor, count=page_size)
        values.update(page.items)
        cursor = page.next_cursor
        if not cursor:
            return values


def refs_demo() -> list:
    """What a ``JobRef`` is: a value, printed ``queue/id``, a ``(queue, id)`` tuple."""
    ref = JobRef("lines", "r1-line-0")
    queue, job_id = ref
    return [str(ref), ref.queue, ref.id, JobRef.parse("lines/r1-line-0") == ref, (queue, job_id)]
