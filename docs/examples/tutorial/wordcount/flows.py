"""The tutorial's flow (docs/tutorial/index.md#add-a-flow).

A parent on the queue ``reports`` that waits for one child per text on the
queue ``counting``.
"""

import echomq_django as emq


def count_words(report_id, texts):
    """Adds the flow: one ``wordcount.count`` child per text (list of str),
    then ``wordcount.total`` with the id ``report-<report_id>``. Returns the
    ``FlowRef`` (its ``parent_id`` and ``child_ids``)."""
    return emq.add_flow(
        emq.Flow(
            "reports",
            "wordcount.total",
            {},
            job_id=f"report-{report_id}",
            children=[emq.Flow("counting", "wordcount.count", {"text": text}) for text in texts],
        )
    )
