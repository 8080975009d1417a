"""Template filters of the admin pages
(docs/howto/operate.md#what-the-admins-pages-show): states as coloured badges,
policies and durations in words, errors folded to their first line, a
job's progress in words, long names made breakable.
``{% load echomq_admin %}``; every filter escapes what it is given.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe

from ..core.exceptions import error_headline, error_unkeyed
from ..monitoring.stats import duration

register = template.Library()

# a child's policy token -> what it means for the parent (docs/explanation/protocol.md#policies)
POLICY_WORDS = {
    "fp": "fail the parent",
    "id": "ignore (the parent goes on)",
    "rd": "remove (the parent goes on)",
}
POLICY_TITLES = {
    "fp": "fail_parent_on_failure: if this child dies, its parent dies too",
    "id": "ignore_dependency_on_failure: if this child dies, the parent records it and goes on",
    "rd": "remove_dependency_on_failure: if this child dies, it is dropped from the parent",
}
STATE_WORDS = {"awaiting_children": "awaiting children"}


SHORT_WORDS = {"awaiting_children": "awaiting"}  # in narrow list columns


@register.filter
def emq_state(state, short: bool = False) -> str:
    """A state as a badge: ``<span class="emq-badge emq-state-dead">dead</span>``;
    ``short`` uses the shorter word where there is one (the full one as title)."""
    value = str(state or "")
    if not value:
        return "-"
    words = STATE_WORDS.get(value, value)
    if short and value in SHORT_WORDS:
        return format_html(
            '<span class="emq-badge emq-state-{}" title="{}">{}</span>',
            value,
            words,
            SHORT_WORDS[value],
        )
    return format_html('<span class="emq-badge emq-state-{}">{}</span>', value, words)


@register.filter
def emq_policy(token) -> str:
    """A child's failure policy in words, the token's full name as its title."""
    value = str(token or "")
    if value not in POLICY_WORDS:
        return value or "-"
    return format_html(
        '<span class="emq-policy" title="{}">on failure: {}</span>',
        POLICY_TITLES[value],
        POLICY_WORDS[value],
    )


@register.filter
def emq_seconds(seconds) -> str:
    """Seconds in words (``4.2 s``, ``3 min 5 s``); ``-`` for None."""
    return duration(None if seconds in (None, "") else float(seconds))


@register.simple_tag
def emq_between(start: datetime | None, end: datetime | None) -> str:
    """The time from ``start`` to ``end`` in words; ``-`` when either is unset
    or ``end`` comes first."""
    if start is None or end is None or end < start:
        return "-"
    return duration((end - start).total_seconds())


@register.filter
def emq_headline(error) -> str:
    """An error's first line (the ``ExcType: message`` the worker writes),
    job keys in it shown as ``queue/id`` (``core.exceptions.error_headline``)."""
    return error_headline(error)


# where a long id, queue, job name or URL may break: after these characters
_BREAK_AFTER = re.compile(r"([-_./:,&?=])")


@register.filter
def emq_breakable(text) -> str:
    """``text`` escaped, with a line-break opportunity (``<wbr>``) after each
    ``- _ . / : , & ? =``, so ``invoice-2026-11-000123-retry`` or
    ``billing.tasks.render_invoice_pdf`` wraps at its joints in a narrow
    column instead of widening it (docs/howto/operate.md#what-the-admins-pages-show)."""
    parts = _BREAK_AFTER.split(str(text if text is not None else ""))
    return mark_safe(
        "".join(conditional_escape(p) + ("<wbr>" if i % 2 else "") for i, p in enumerate(parts))
    )


@register.filter
def emq_unkey(error) -> str:
    """An error with the job keys in it shown as ``queue/id`` (a mirror row
    written before reads did so itself, docs/howto/read-flows.md#job-references)."""
    return error_unkeyed(error)


@register.filter
def emq_has_more(error) -> bool:
    """Whether an error has lines after its first (a traceback to unfold)."""
    return "\n" in str(error or "").strip()


@register.filter
def emq_flag(value, words: str = "yes,no") -> str:
    """A boolean in words that read the right way round (``"gone,in Redis"``):
    the first word, marked, when true; the second, quiet, when false."""
    yes, _, no = words.partition(",")
    if value:
        return format_html('<span class="emq-flag-yes">{}</span>', yes)
    return format_html('<span class="emq-flag-no">{}</span>', no)


PROGRESS_CHARS = 40  # a progress object's JSON in the job list


@register.filter
def emq_progress(value, short: bool = False) -> str:
    """A job's progress (its JSON text, or the decoded value) in words: a
    number as ``"40%"``, an object as its compact JSON (cut to
    ``PROGRESS_CHARS`` with ``short``), ``""`` when it has none
    (docs/howto/progress-and-logs.md#read-them-back). Escaped by the caller
    (``format_html`` or autoescape)."""
    if value in (None, ""):
        return ""
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return f"{value:g}%"
    text = json.dumps(value, separators=(", ", ": "))
    if short and len(text) > PROGRESS_CHARS:
        return text[: PROGRESS_CHARS - 1] + "…"
    return text
