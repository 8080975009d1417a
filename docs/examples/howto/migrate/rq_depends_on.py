# Before: RQ and django-rq with depends_on (docs/howto/migrate.md). Shown for
# comparison only.
import django_rq
from myapp.work import count, total  # plain functions


def count_words(texts):
    queue = django_rq.get_queue("default")
    children = [queue.enqueue(count, text) for text in texts]
    # total must fetch its inputs itself: RQ gives it no results
    return queue.enqueue(total, [job.id for job in children], depends_on=children)
