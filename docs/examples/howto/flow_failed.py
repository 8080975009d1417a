"""Hearing that a child failed its parent
(docs/howto/priorities-rate-limits.md#hearing-about-a-failed-flow).

Put receivers in a module your app imports at startup (its ``jobs.py``, or
``AppConfig.ready()``). The signal is durable: sent at least once, by the
pump's dispatcher, so the receiver must not mind a repeat.
"""

from django.core.cache import cache
from django.dispatch import receiver

from echomq_django.signals import flow_failed


@receiver(flow_failed)
def remember_failed_report(sender, queue, job_id, job_name, error=None, event_id=None, **kwargs):
    """Records why a report failed; ``cache.add`` writes only once, so a
    repeat of the same event changes nothing (with a model: an UPDATE ...
    WHERE status = 'pending')."""
    if queue == "reports":
        cache.add(f"report-failed:{job_id}", {"error": error, "event": event_id}, None)
