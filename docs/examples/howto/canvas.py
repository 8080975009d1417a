"""docs/howto/canvas.md: a checkout as a canvas. The prices of an order's
lines are fetched in parallel (a group, on the `prices` queue); their total
is a chord's callback; tax and the receipt are the next links of the chain,
each reading the result before it."""

import echomq_django as emq

PRICES = {"book": 1200, "pen": 150, "lamp": 3400}  # cents


@emq.handler("checkout.price")
def price(job):
    return PRICES[job.payload["sku"]] * job.payload["qty"]


@emq.handler("checkout.total")
def total(job):
    # a chord's callback: the group's results, in the group's order
    return sum(emq.group_results(job))


@emq.handler("checkout.add_tax")
def add_tax(job):
    # a chain's link: the result of the link before it
    return round(emq.previous_result(job) * (1 + job.payload["rate"]))


@emq.handler("checkout.receipt")
def receipt(job):
    return {"order": job.payload["order"], "due_cents": emq.previous_result(job)}


def checkout(order: str, lines: dict[str, int]) -> emq.JobRef:
    prices = emq.group(
        [emq.task("checkout.price", queue="prices", sku=sku, qty=qty) for sku, qty in lines.items()]
    )
    return emq.chain(
        prices,  # a group first in a chain: the next link is its chord's callback
        emq.task("checkout.total", queue="orders"),
        emq.task("checkout.add_tax", queue="orders", rate=0.2),
        emq.task("checkout.receipt", queue="orders", order=order).set(job_id=f"receipt-{order}"),
    ).enqueue(on_commit=False)


def receipt_of(ref: emq.JobRef) -> dict:
    return emq.wait(ref, timeout_s=5.0).result
