"""Mounted at ``/orders/`` by testproject/urls.py."""

from django.urls import path

from . import views

app_name = "orders"
urlpatterns = [
    path("", views.orders, name="orders"),
    path("<int:pk>/", views.order_detail, name="detail"),
]
