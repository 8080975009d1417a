"""The handler registry: job name -> callable (DESIGN §8).

``@handler("orders.fulfil")`` registers a function taking a ``Job`` and
returning a JSON-serialisable result. Each installed app's ``jobs`` module is
imported at startup (``AppConfig.ready``), the way the admin finds
``admin.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from django.utils.module_loading import autodiscover_modules

_registry: dict[str, Callable] = {}


def handler(name: str) -> Callable[[Callable], Callable]:
    """Register the decorated callable as the handler of job ``name`` (str).

    Raises ``ValueError`` when ``name`` is empty or already registered to a
    different callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a handler needs a job name, got {name!r}")

    def register(func: Callable) -> Callable:
        current = _registry.get(name)
        if (
            current is not None
            and current is not func
            and (
                getattr(current, "__qualname__", None) != getattr(func, "__qualname__", None)
                or getattr(current, "__module__", None) != getattr(func, "__module__", None)
            )
        ):
            raise ValueError(f"job name {name!r} already has a handler: {current!r}")
        _registry[name] = func
        return func

    return register


def get_handler(name: str) -> Callable | None:
    """The handler registered under ``name``, or None."""
    return _registry.get(name)


def registered() -> list[str]:
    """Sorted names of every registered handler."""
    return sorted(_registry)


def autodiscover() -> None:
    """Import every installed app's ``jobs`` module."""
    autodiscover_modules("jobs")
