from django.apps import AppConfig


class WorkerAppConfig(AppConfig):
    name = "tests.support.workerapp"
    label = "workerapp"
