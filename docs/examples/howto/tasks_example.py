"""Django's tasks framework on echomq (docs/howto/tasks-backend.md)."""

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2: the django-tasks backport


@task(queue_name="default")
def add_numbers(a, b):
    """Any module will do: the job names the task by its import path."""
    return a + b


@task(queue_name="default", priority=10)
async def shout(text):
    """``async def`` tasks run as async handlers do."""
    return text.upper()
