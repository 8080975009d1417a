"""URLs of echomq_django
(docs/explanation/house.md#monitoring). Include them under a path of yours::

    urlpatterns = [..., path("echomq/", include("echomq_django.urls"))]

which serves ``echomq/metrics/`` (Prometheus' text format; staff users, or
a bearer token when ``ECHOMQ["METRICS"]["ACCESS"]`` is ``"token"``).
"""

from django.urls import path

from .monitoring.metrics import metrics_view

app_name = "echomq_django"

urlpatterns = [
    path("metrics/", metrics_view, name="metrics"),
]
