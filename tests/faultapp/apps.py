from django.apps import AppConfig


class FaultAppConfig(AppConfig):
    name = "tests.faultapp"
    label = "faultapp"
