"""Cancel and remove (docs/howto/cancel-remove.md)."""

import echomq_django as emq


def cancel_report(report_id):
    """Stops a flow: the parent dies ``cancelled``, then its unfinished
    children. Returns the state the parent was found in (``awaiting_children``
    here; an ``active`` job is only marked, and dies when its worker reports)."""
    try:
        return emq.cancel("reports", f"report-{report_id}").state
    except emq.JobNotFound:
        return None  # gone already (removed, or taken by retention)
    except emq.JobNotCancellable:
        return "finished"  # completed or dead before we got there


def forget_report(report_id):
    """Deletes a flow from Redis, with its subtree (children on other queues
    too, before it returns). Returns how many rows went on the parent's own
    queue; refuses a job that is running (``JobNotRemovable``)."""
    return emq.remove("reports", f"report-{report_id}").removed


@emq.handler("reports.export")
def export(job):
    """A long handler that stops early once its job is cancelled while it
    runs (the worker sets ``job.cancelled`` when a heartbeat is refused)."""
    done = 0
    for _chunk in range(job.payload["chunks"]):
        if job.cancelled:
            return {"stopped_after": done}  # the result is dropped anyway
        done += 1  # export one chunk here
    return {"exported": done}
