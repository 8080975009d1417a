from django.http import JsonResponse
from opentelemetry import trace

import echomq_django as emq

tracer = trace.get_tracer("shop.views")


def checkout(request, order: int):
    # With opentelemetry-instrumentation-django the request's span exists
    # already; without it, the view opens one.
    with tracer.start_as_current_span("POST /checkout", kind=trace.SpanKind.SERVER):
        ref = emq.add_flow(
            emq.Flow(
                "shipping",
                "shop.ship",
                {"order": order},
                job_id=f"ship-{order}",
                children=[emq.Flow("packing", "shop.pack", {"item": i}) for i in ("book", "lamp")],
            ),
            on_commit=False,
        )
    return JsonResponse({"jobs": [str(node) for node in ref.nodes]})
