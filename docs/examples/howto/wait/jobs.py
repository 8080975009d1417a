import echomq_django as emq


@emq.handler("quotes.price")
def price(job):
    if job.payload["sku"] == "discontinued":
        raise emq.Unrecoverable("no price for a discontinued item")
    return {"sku": job.payload["sku"], "price_cents": 4200}
