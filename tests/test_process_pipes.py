"""The process pool's pipe reading (``runners/processes/pipes.py``) and its
cheap per-job reads: messages sent one by one come out whole and in order
from one read, a message split across reads waits for its rest, a message
larger than a read arrives whole, the end of the pipe is told apart from an
empty one; a job crosses the pipe as its public fields and comes back equal;
the resident-memory read sees memory grow; several framed messages go in
one write; a handler's progress write looks for its refusal without taking
the next job queued behind it."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

from echomq_django.core.exceptions import EchoMQError
from echomq_django.core.jobs import Job, JobState
from echomq_django.runners.processes.child import PipeWrites, rss_bytes, wire
from echomq_django.runners.processes.pipes import CHUNK, NOTHING, Inbox, frame, write_all


@pytest.fixture
def pipe():
    ours, theirs = multiprocessing.get_context("fork").Pipe(duplex=True)
    yield ours, theirs
    ours.close()
    if not theirs.closed:
        theirs.close()


def test_every_message_in_one_read_comes_out_in_order(pipe) -> None:
    ours, theirs = pipe
    sent = [("write", "j1", "50", None), None, ("ok", {"n": 1}, 0.2, 4096)]
    for message in sent:
        theirs.send_bytes(pickle.dumps(message, 5))
    inbox = Inbox(ours.fileno())
    inbox.fill()  # all three are in the pipe: one read takes them
    assert [inbox.take(), inbox.take(), inbox.take()] == sent
    assert inbox.take() is NOTHING
    assert inbox.get(block=False) is NOTHING
    assert not inbox.ready()


def test_a_message_split_across_reads_waits_for_its_rest(pipe) -> None:
    ours, theirs = pipe
    whole = pickle.dumps(("ok", "x" * 100, 1.0, 0), 5)
    framed = len(whole).to_bytes(4, "big") + whole
    inbox = Inbox(ours.fileno())
    os.write(theirs.fileno(), framed[:3])  # not even the whole size yet
    inbox.fill()
    assert inbox.take() is NOTHING
    os.write(theirs.fileno(), framed[3:50])
    inbox.fill()
    assert inbox.take() is NOTHING
    os.write(theirs.fileno(), framed[50:])
    assert inbox.ready()
    assert inbox.get() == ("ok", "x" * 100, 1.0, 0)
    assert inbox.buf == bytearray()


def test_a_message_larger_than_a_read_arrives_whole(pipe) -> None:
    ours, theirs = pipe
    big = "y" * (3 * CHUNK)
    theirs.send_bytes(pickle.dumps(("ok", big, 1.0, 0), 5))  # fits the socket's buffer
    theirs.send_bytes(pickle.dumps(None, 5))
    inbox = Inbox(ours.fileno())
    assert inbox.get() == ("ok", big, 1.0, 0)
    assert inbox.get() is None  # a message may be None: told apart from NOTHING


def test_the_end_of_the_pipe_raises_eof_after_the_last_message(pipe) -> None:
    ours, theirs = pipe
    theirs.send(("ok", 1, 1.0, 0))  # Connection.send frames the same way
    theirs.close()
    inbox = Inbox(ours.fileno())
    assert inbox.get() == ("ok", 1, 1.0, 0)
    assert inbox.ready()  # the end is readable: a read will not block
    with pytest.raises(EOFError, match="the other end of the pipe closed"):
        inbox.get()


def test_a_job_crosses_the_pipe_as_its_public_fields() -> None:
    job = Job(id="7", queue="q", name="n", payload={"a": [1, 2]}, state=JobState.ACTIVE,
              attempts=2, max_attempts=5, lease="tok", lease_deadline=99, timeout_ms=300,
              traceparent="00-ab-cd-01", retry_policy="never")  # fmt: skip
    job._writes, job._cache["x"] = object(), 1  # the worker's: they stay behind
    back = Job(*pickle.loads(pickle.dumps(wire(job), 5)))
    assert back == job
    assert (back.state, back.timeout_ms, back.retry_policy) == (JobState.ACTIVE, 300, "never")
    assert (back._mq, back._writes, back._cache, back._adds) == (None, None, {}, None)


def test_the_resident_memory_read_sees_memory_grow() -> None:
    before = rss_bytes()
    kept = bytearray(64 << 20)
    kept[:: 1 << 12] = b"x" * len(kept[:: 1 << 12])  # touch every page
    assert rss_bytes() - before >= 60 << 20
    del kept


def test_several_framed_messages_in_one_write_come_out_in_order(pipe) -> None:
    ours, theirs = pipe
    sent = [(("f",) * 3, "m:f"), ("refused", "j1", "e"), None]
    write_all(theirs.fileno(), b"".join(frame(pickle.dumps(m, 5)) for m in sent))
    inbox = Inbox(ours.fileno())
    assert [inbox.get(), inbox.get(), inbox.get()] == sent
    assert inbox.get(block=False) is NOTHING


def test_a_progress_write_keeps_the_job_queued_behind_and_raises_its_refusal(pipe) -> None:
    ours, theirs = pipe  # ours: the handler process's end
    queued = (("fields",), "m:f")
    for message in (queued, ("refused", "old", EchoMQError("late")),
                    ("refused", "j1", EchoMQError("the lease was lost"))):  # fmt: skip
        theirs.send_bytes(pickle.dumps(message, 5))
    inbox = Inbox(ours.fileno())
    writes = PipeWrites(ours, inbox, "j1")
    with pytest.raises(EchoMQError, match="the lease was lost"):
        writes.put(None, "50", None)
    assert not theirs.poll()  # the refused write was not sent
    assert inbox.get() == queued  # still there, for the child's loop
    assert inbox.get(block=False) is NOTHING  # the notes were taken
