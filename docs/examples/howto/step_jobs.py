"""docs/howto/step-jobs.md: one job that runs in steps. It keeps its step
in its own payload, waits between steps without spending an attempt, and
adds children (on another queue) whose results it reads when it runs
again."""

import echomq_django as emq


@emq.handler("shop.fulfil")
def fulfil(job):
    step = job.payload["step"]
    if step == "reserve":
        # step 1: save progress in the payload, then come back in 50 ms
        job.update_payload({**job.payload, "step": "ship"})
        job.move_to_delayed(50)  # raises MoveToDelayed: the attempt ends here
    if step == "ship":
        # step 2: one child per parcel, on the shipping queue; wait for them.
        # Children first, then the step: run again after a crash here, it
        # adds the same children (the same ids, counted once)
        parcels = [
            emq.Flow("shipping", "shop.ship_parcel", {"parcel": p}) for p in job.payload["parcels"]
        ]
        job.add_children(parcels)
        job.update_payload({**job.payload, "step": "done"})
        raise emq.WaitForChildren
    # step 3: runs once every parcel shipped, with their results (run again
    # after a crash before the wait began, it waits first)
    if job.dependencies().unprocessed:
        raise emq.WaitForChildren
    tracking = sorted(job.children_values().values())
    return {"order": job.payload["order"], "tracking": tracking}


@emq.handler("shop.ship_parcel")
def ship_parcel(job):
    return f"TRACK-{job.payload['parcel']}"


def fulfil_order(order: int, parcels: list[str]) -> str:
    """Add the order's job (returns its id): its first step runs as soon as
    a worker is free."""
    return emq.enqueue(
        "orders", "shop.fulfil", {"order": order, "step": "reserve", "parcels": parcels}
    )
