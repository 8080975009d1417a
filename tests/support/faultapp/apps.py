from django.apps import AppConfig


class FaultAppConfig(AppConfig):
    name = "tests.support.faultapp"
    label = "faultapp"
