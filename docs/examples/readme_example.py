# settings.py: INSTALLED_APPS += ["echomq_django"]; ECHOMQ = {"URL": "redis://127.0.0.1:6379/0"}
# myshop/jobs.py (found at start, as admin.py is):
import echomq_django as emq


@emq.handler("shop.charge")
def charge(job):
    return {"charged": job.payload["amount"]}


@emq.handler("shop.receipt")
def receipt(job):  # runs once both charges completed, on their results
    charges = job.children_values()  # {JobRef("payments", "charge-30"): {"charged": 30}, ...}
    return {"order": job.payload["order"], "total": sum(c["charged"] for c in charges.values())}


# in a view, a signal receiver or the shell: one atomic add, parent first
charges = [
    emq.Flow("payments", "shop.charge", {"amount": a}, job_id=f"charge-{a}") for a in (30, 12)
]
emq.add_flow(
    emq.Flow("orders", "shop.receipt", {"order": 42}, job_id="receipt-42", children=charges)
)
# then: ./manage.py runworker orders payments  and  ./manage.py runpump orders payments
