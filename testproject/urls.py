from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", include("testproject.orders.urls")),
    path("echomq/", include("echomq_django.urls")),  # metrics/ (docs/reference/metrics.md)
]
