"""The handler registry: job name -> callable (docs/explanation/glossary.md#running-a-job).

``@handler("orders.fulfil")`` registers a function taking a ``Job`` and
returning a JSON-serialisable result. Each installed app's ``jobs`` module is
imported at startup (``AppConfig.ready``), the way the admin finds
``admin.py``.

``async def`` handlers are wrapped at registration with
asgiref's ``async_to_sync``, the way Django runs async code from sync code
(``Task.call`` does the same): each job's coroutine runs on an event loop of
its own, on a helper thread, while the worker's handler thread waits for it
and serves the coroutine's thread-sensitive ``sync_to_async`` calls (the async
ORM). So database connections stay one per handler thread, as for sync
handlers, and ``concurrency`` bounds the coroutines in flight. The decorator
returns the coroutine function unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib.util import find_spec
from inspect import iscoroutinefunction
from typing import Any

from asgiref.sync import async_to_sync
from django.utils.module_loading import autodiscover_modules

_registry: dict[str, Callable[..., Any]] = {}


def runs_sync(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` itself, or for a coroutine function a sync wrapper around it."""
    if not iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def run(job):
        return async_to_sync(func)(job)

    run.coroutine_function = func  # the async pool awaits it on its loop
    return run


def coroutine_function(func: Callable[..., Any]) -> Callable[..., Any] | None:
    """The coroutine function a registered handler (``get_handler``'s) wraps,
    or None for a sync handler (docs/howto/async-handlers.md#the-async-pool)."""
    return getattr(func, "coroutine_function", None)


def handler(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated callable as the handler of job ``name`` (str).

    Raises ``ValueError`` when ``name`` is empty or already registered to a
    different callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a handler needs a job name, got {name!r}")

    def register(func: Callable) -> Callable:
        current = _registry.get(name)
        current = getattr(current, "__wrapped__", current)
        if (
            current is not None
            and current is not func
            and (
                getattr(current, "__qualname__", None) != getattr(func, "__qualname__", None)
                or getattr(current, "__module__", None) != getattr(func, "__module__", None)
            )
        ):
            raise ValueError(f"job name {name!r} already has a handler: {current!r}")
        _registry[name] = runs_sync(func)
        return func

    return register


def get_handler(name: str) -> Callable | None:
    """The handler registered under ``name`` (sync: an ``async def`` one
    comes wrapped), or None."""
    return _registry.get(name)


def registered() -> list[str]:
    """Sorted names of every registered handler."""
    return sorted(_registry)


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module."""
    autodiscover_modules("jobs")


TASK_JOB_NAME = "echomq_django.task"  # a Django @task's job (echomq_django/tasks.py registers it)


def tasks_framework() -> str | None:
    """The tasks framework importable now: ``"django.tasks"`` (Django 6),
    ``"django_tasks"`` (the backport, Django 5.2) or None (no import is
    done, only a look-up). docs/howto/tasks-backend.md"""
    for name in ("django.tasks", "django_tasks"):
        try:
            if find_spec(name) is not None:
                return name
        except ImportError:  # the parent package is missing
            continue
    return None
