from django.urls import path

from . import views

urlpatterns = [
    path("jobs/<str:queue>/<str:job_id>/events", views.job_events),
    path("ajobs/<str:queue>/<str:job_id>/events", views.ajob_events),  # under ASGI
]
