import echomq_django as emq


@emq.handler("shop.pack")
def pack(job):
    return job.payload["item"]


@emq.handler("shop.ship")
def ship(job):
    """The flow's parent: runs once both packing jobs completed."""
    return {"order": job.payload["order"], "items": sorted(job.children_values().values())}
