"""The tutorial's handlers (docs/tutorial/index.md#write-the-handlers).

Every installed app's ``jobs`` module is imported when Django starts, so
these two handlers are registered in the web server, the shell and the
worker alike.
"""

import echomq_django as emq


@emq.handler("wordcount.count")
def count(job):
    """A child: counts the words of one text, ``job.payload["text"]`` (str)."""
    text = job.payload["text"]
    return {"words": len(text.split())}


@emq.handler("wordcount.total")
def total(job):
    """The parent: runs once every child completed, on their results."""
    counts = job.children_values()  # {JobRef: the child's result}
    return {
        "documents": len(counts),
        "words": sum(result["words"] for result in counts.values()),
    }
