"""docs/howto/retries.md: a charge retried on the gateway's timeouts only,
with a list backoff and jitter; a declined card that dies at once; a
gateway that says when to come back (Retry); a quote that expires.

In a project, the code is an app's ``jobs.py`` (its handlers are found
there), and the ``ECHOMQ`` at the end goes in ``settings.py``; here it is
one module, ``retries``, which the dotted paths name."""

import echomq_django as emq


class GatewayTimeout(Exception):
    """The gateway did not answer in time: another try may work."""


class CardDeclined(Exception):
    """The bank said no: another try would say no again."""


class GatewayBusy(Exception):
    """The gateway asked us to come back after ``retry_after_s`` seconds."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"busy, retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


def call_gateway(payload: dict, attempt: int) -> dict:
    """Stands in for your payment gateway's client: ``answers`` says what it
    does on each attempt ("timeout", "declined", "busy" or "ok"). A real one
    raises the same three exceptions for the same three cases."""
    answer = payload["answers"][attempt - 1]
    if answer == "timeout":
        raise GatewayTimeout(f"order {payload['order']}: no answer in 10 s")
    if answer == "declined":
        raise CardDeclined(f"order {payload['order']}: card declined")
    if answer == "busy":
        raise GatewayBusy(retry_after_s=2)
    return {"order": payload["order"], "charged": True}


@emq.handler("payments.charge")
def charge(job):
    try:
        return call_gateway(job.payload, job.attempts)
    except GatewayBusy as busy:  # it said when: counted as an attempt, no jitter
        raise emq.Retry(after_ms=busy.retry_after_s * 1000) from busy


def charge_now(order: str, answers: list[str]) -> str:
    """One job's own policy wins over its queue's, key by key."""
    return emq.enqueue(
        "payments",
        "payments.charge",
        {"order": order, "answers": answers},
        # a dotted path: the module that defines backoff_for (below), here
        # "retries"; in your project yours, e.g. "payments.jobs.backoff_for"
        backoff="retries.backoff_for",  # a function: f(attempt, error) -> ms
        jitter=0,
        dont_retry_on=[CardDeclined],
        expires_ms=30_000,  # a charge nobody started in 30 s is not made at all
        on_commit=False,
    )


def backoff_for(attempt: int, error: BaseException) -> int:
    """A backoff function: ms before the next attempt (a whole number >= 0)."""
    return 500 if isinstance(error, GatewayTimeout) else 10_000 * attempt


@emq.handler("quotes.refresh")
def refresh_quote(job):
    return {"sku": job.payload["sku"], "price_cents": 4200}


def refresh(sku: str) -> str:
    return emq.enqueue("quotes", "quotes.refresh", {"sku": sku}, on_commit=False)


def charge_order(order: str, answers: list[str]) -> str:
    return emq.enqueue(
        "payments",
        "payments.charge",
        {"order": order, "answers": answers},
        on_dead="payments.give_up",  # a job of its own once the charge is dead
        on_commit=False,
    )


GAVE_UP: list = []  # stands in for an e-mail to the customer


@emq.handler("payments.give_up")
def give_up(job):
    """Runs as its own job when a charge dies: ``job.payload`` is
    ``{"job": "payments/<id>", "error": "<its last error>"}``."""
    GAVE_UP.append((job.payload["job"], job.payload["error"].splitlines()[0]))


# settings.py: the queues' options go in ECHOMQ["QUEUES"], next to your "URL"
ECHOMQ = {
    "URL": "redis://localhost:6379/0",
    "QUEUES": {
        "payments": {
            "MAX_ATTEMPTS": 5,
            "BACKOFF": [1000, 5000, 30000, 120000],  # ms before attempts 2, 3, 4, 5
            "JITTER": 0.2,  # each wait shortened by up to 20%, at random
            # a dotted path: the module that defines GatewayTimeout, here
            # "retries"; in your project yours, e.g. "payments.jobs.GatewayTimeout"
            "RETRY_ON": ["retries.GatewayTimeout"],
        },
        "quotes": {"EXPIRES_MS": 60_000},  # not started within a minute: worthless
    },
}

QUEUES = ECHOMQ["QUEUES"]  # what tests/test_docs_examples.py runs the example with
