# Before: a Celery chord (docs/howto/migrate.md). Shown for comparison only.
from celery import chord, shared_task


@shared_task
def count(text):
    return len(text.split())


@shared_task
def total(counts):
    return sum(counts)


def count_words(texts):
    return chord(count.s(text) for text in texts)(total.s())
