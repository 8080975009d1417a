# settings.py (docs/howto/tasks-backend.md)
INSTALLED_APPS += ["echomq_django"]  # noqa: F821  Django 5.2: also "django_tasks"

TASKS = {
    "default": {
        "BACKEND": "echomq_django.tasks.EchoMQBackend",
        "QUEUES": ["default", "emails"],  # the queues a @task's queue_name may use
        "OPTIONS": {
            "MAX_ATTEMPTS": 1,  # the framework's default: a task runs once
            "ON_COMMIT": None,  # inside atomic(): after the commit
        },
    }
}
