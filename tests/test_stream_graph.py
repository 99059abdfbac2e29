"""The stream graph's dependency rules, on the graph alone: no queue, no thread, no device.

Each test adds operations with footprints on a few streams and reads what the
graph derived: the edges a ticket waits on (and why: "stream", "derived",
"barrier", "event", "requires"), whether it is ready, and what a failure
does to what follows. Nothing here runs an operation: `finish` below does
what a pipeline worker does once it has run one (a simulated start and end,
then the graph's completion), so a test decides when work is done and how it
went. Region 1 is the device memory; the offsets are bytes.
"""

from __future__ import annotations

import itertools
import threading

import pytest

from spyre_runtime.queue import (Barrier, DeviceAddress, Footprint, HostAddress, HostCallback, Range, Signal,
                                 SoftSignal, StreamError, Transfer, TransferKind, Wait, WaitTimeout)
from spyre_runtime.queue.poison import Poison
from spyre_runtime.queue.stream_graph import StreamGraph

A, B, C, D = 1, 2, 3, 4  # stream ids


def op(name: str, reads=(), writes=()) -> HostCallback:
    """A host callback standing for any operation: only its footprint matters here."""
    as_ranges = lambda spans: tuple(Range(1, offset, length) for offset, length in spans)  # noqa: E731
    return HostCallback(lambda: None, Footprint(as_ranges(reads), as_ranges(writes)), name=name)


class Graph:
    """A StreamGraph with sequence numbers handed out in order, as the queue's submission does."""

    def __init__(self, **how):
        self.graph = StreamGraph(**how)
        self._seq = itertools.count(1)

    def add(self, stream: int, operation, **how):
        return self.graph.add(stream, operation, next(self._seq), **how)

    def finish(self, ticket, error: BaseException | None = None, cost: float = 10.0) -> None:
        """What a worker does after running `ticket`: it ends `cost` after it became ready."""
        assert ticket.ready, f"{ticket!r} was run before it was ready"
        ticket.sim_start = ticket.ready_sim
        ticket.sim_end = ticket.sim_start + cost
        self.graph.make_ready(self.graph.complete(ticket, error))


def waits_on(ticket) -> list[tuple[int, str]]:
    return [(dep.seq, why) for dep, why in ticket.edges]


# ---- order within a stream, and footprints across streams ---------------------------------


def test_an_operation_waits_for_the_previous_one_of_its_stream_only_until_it_is_done():
    g = Graph()
    first = g.add(A, op("first", writes=[(0, 8)]))
    second = g.add(A, op("second", writes=[(64, 8)]))  # no overlap: stream order alone holds it
    assert first.ready and not second.ready
    assert waits_on(second) == [(first.seq, "stream")]
    g.finish(first)
    assert second.ready
    assert second.ready_sim == first.sim_end
    g.finish(second)
    third = g.add(A, op("third"))  # its predecessor is done: nothing to wait for
    assert third.ready and waits_on(third) == []


def test_a_read_of_another_streams_unfinished_write_waits_for_it_and_a_disjoint_read_does_not():
    g = Graph()
    writer = g.add(A, op("write 0..16", writes=[(0, 16)]))
    overlapping = g.add(B, op("read 8..12", reads=[(8, 4)]))
    disjoint = g.add(C, op("read 16..32", reads=[(16, 16)]))
    assert waits_on(overlapping) == [(writer.seq, "derived")]
    assert not overlapping.ready
    assert disjoint.ready and waits_on(disjoint) == []
    g.finish(writer)
    assert overlapping.ready


def test_reads_never_order_reads_but_a_write_waits_for_another_streams_reads():
    g = Graph()
    reader = g.add(A, op("read", reads=[(0, 16)]))
    other_reader = g.add(B, op("read too", reads=[(0, 16)]))
    assert other_reader.ready and waits_on(other_reader) == []
    writer = g.add(C, op("overwrite", writes=[(4, 4)]))  # write after read
    assert {why for _, why in waits_on(writer)} == {"derived"}
    assert {seq for seq, _ in waits_on(writer)} == {reader.seq, other_reader.seq}
    g.finish(reader)
    assert not writer.ready
    g.finish(other_reader)
    assert writer.ready


def test_only_the_newest_conflicting_operation_of_a_stream_is_waited_for():
    g = Graph()
    older = g.add(A, op("older write", writes=[(0, 8)]))
    newer = g.add(A, op("newer write", writes=[(0, 8)]))
    reader = g.add(B, op("read", reads=[(0, 8)]))
    # The stream finishes in order: the newer write done means the older one is done too.
    assert waits_on(reader) == [(newer.seq, "derived")]
    g.finish(older)
    assert not reader.ready
    g.finish(newer)
    assert reader.ready


def test_finished_conflicting_work_still_orders_a_new_operation_in_simulated_time():
    g = Graph()
    writer = g.add(A, op("write", writes=[(0, 8)]))
    g.finish(writer, cost=500.0)
    reader = g.add(B, op("read", reads=[(0, 8)]))
    unrelated = g.add(C, op("read elsewhere", reads=[(32, 8)]))
    assert reader.ready and waits_on(reader) == []  # done in host time: no edge
    assert reader.ready_sim == writer.sim_end == 500.0  # but it cannot start before it ends
    assert unrelated.ready_sim == 0.0
    g.graph.sim_floor = 800.0  # the host has observed a later time: nothing starts before it
    assert g.add(C, op("later", reads=[(0, 8)])).ready_sim == 800.0


# ---- barriers ------------------------------------------------------------------------------


def test_a_barrier_without_a_footprint_waits_for_everything_added_before_it_on_any_stream():
    g = Graph()
    a = g.add(A, op("a", writes=[(0, 8)]))
    b = g.add(B, op("b", writes=[(8, 8)]))
    done = g.add(C, op("c", writes=[(16, 8)]))
    g.finish(done, cost=30.0)
    barrier = g.add(C, Barrier())
    assert sorted(waits_on(barrier)) == [(a.seq, "barrier"), (b.seq, "barrier")]
    assert barrier.ready_sim == done.sim_end  # the finished stream orders it in simulated time only
    after = g.add(C, op("after", reads=[(40, 8)]))
    g.finish(a)
    assert not barrier.done
    g.finish(b)
    assert barrier.done and not barrier.error  # a control operation completes once ready
    assert after.ready


def test_a_barrier_with_a_footprint_holds_only_for_conflicting_work():
    g = Graph()
    writer = g.add(A, op("write the program", writes=[(0, 8)]))
    stuck = g.add(B, op("unrelated, slow", writes=[(64, 8)]))
    barrier = g.add(C, Barrier(footprint=Footprint(reads=(Range(1, 0, 8),))))
    assert waits_on(barrier) == [(writer.seq, "derived")]
    g.finish(writer)
    assert barrier.done and not stuck.done


def test_a_barrier_that_requires_an_earlier_operation_fails_with_it_and_stops_its_stream():
    g = Graph()
    patch = op("patch", writes=[(0, 8)])
    patch_ticket = g.add(A, patch)
    barrier = g.add(B, Barrier(requires=(patch,)), batch={id(patch): patch_ticket})
    behind = g.add(B, op("compute", reads=[(100, 8)]))
    assert waits_on(barrier) == [(patch_ticket.seq, "requires")]
    g.finish(patch_ticket, error=RuntimeError("the patch failed"))
    assert barrier.done and isinstance(barrier.error, StreamError)
    assert "patch" in str(barrier.error)
    assert behind.skipped  # its stream stopped at the barrier


def test_a_barriers_requirement_must_be_in_the_same_batch():
    g = Graph()
    patch = op("patch", writes=[(0, 8)])
    g.add(A, patch)
    with pytest.raises(ValueError, match="same enqueue_runs call"):
        g.add(B, Barrier(requires=(patch,)), batch={})


# ---- signals and waits ---------------------------------------------------------------------


def test_a_wait_added_before_its_signal_holds_until_the_signal_is_added_and_fires():
    unsignaled = []
    g = Graph()
    g.graph.on_unsignaled = lambda: unsignaled.append(True)
    signal = SoftSignal()
    wait = g.add(B, Wait(signal))
    assert not wait.ready and wait in g.graph.unsignaled and unsignaled  # its watchdog would start
    work = g.add(A, op("work", writes=[(0, 8)]))
    fire = g.add(A, Signal(signal))
    assert wait not in g.graph.unsignaled and (fire.seq, "event") in waits_on(wait)
    g.finish(work, cost=70.0)
    assert fire.done and signal.fired and signal.sim_time_ns == 70.0
    assert wait.done and wait.ready_sim == 70.0


def test_a_wait_on_a_signal_that_already_fired_is_ready_at_once():
    g = Graph()
    signal = SoftSignal()
    g.add(A, Signal(signal))
    wait = g.add(B, Wait(signal))
    assert wait.done and not wait.error


def test_a_wait_whose_signal_is_never_added_times_out():
    g = Graph(wait_timeout=5.0)
    wait = g.add(B, Wait(SoftSignal()))
    behind = g.add(B, op("behind", reads=[(0, 8)]))
    assert g.graph.expire_waits(wait.deadline - 1.0) == wait.deadline  # not yet
    assert not wait.done
    assert g.graph.expire_waits(wait.deadline) is None
    assert isinstance(wait.error, WaitTimeout)
    assert behind.skipped


def test_a_signal_of_another_device_hands_the_waiter_back_to_its_own_graph():
    zero, one = Graph(device=0), Graph(device=1)
    signal = SoftSignal()
    work = zero.add(A, op("work on spyre:0", writes=[(0, 8)]))
    zero.add(A, Signal(signal))
    wait = one.add(A, Wait(signal))  # on spyre:1: the signal's owner is the other graph
    assert not wait.ready and (one.graph, wait) in signal.waiters
    zero.finish(work, cost=40.0)  # the signal fires on spyre:0; spyre:1's graph readies its wait
    assert wait.done and wait.ready_sim == 40.0


# ---- failures ------------------------------------------------------------------------------


def test_a_failure_stops_its_stream_and_poisons_what_it_was_to_write_for_every_stream():
    g = Graph()
    failing = g.add(A, op("fails", writes=[(0, 16)]))
    skipped = g.add(A, op("behind it", writes=[(32, 8)]))
    g.finish(failing, error=ValueError("boom"))
    stream_a = g.graph.stream(A)
    assert isinstance(stream_a.error, StreamError) and "boom" in str(stream_a.error)
    assert skipped.skipped and skipped.pending_error is stream_a.error
    # Another stream keeps working, but reads neither what failed work was to write ...
    reader = g.add(B, op("reads the failed output", reads=[(8, 4)]))
    assert reader.done and isinstance(reader.error, StreamError)
    assert "boom" in str(reader.error) and "never wrote" in str(reader.error)
    # ... nor what the skipped work was to write, naming the original failure.
    second = g.add(C, op("reads the skipped output", reads=[(32, 8)]))
    assert "boom" in str(second.error)
    assert g.add(D, op("reads elsewhere", reads=[(100, 8)])).ready
    # A refused read stops its own stream in turn: nothing behind it runs as if it had.
    assert g.add(C, op("behind the refused read", reads=[(100, 8)])).skipped


def test_a_transfer_over_poisoned_bytes_clears_them_and_a_declared_write_does_not():
    g = Graph()
    g.finish(g.add(A, op("fails", writes=[(0, 16)])), error=ValueError("boom"))
    g.finish(g.add(B, op("declares a write over it", writes=[(0, 16)])))
    assert g.graph.poison.ranges  # a declared write is a span that may have holes
    copy = g.add(B, Transfer(TransferKind.H2D, HostAddress(0), DeviceAddress(1, 0), 8))
    g.finish(copy)
    assert [p.range for p in g.graph.poison.ranges] == [Range(1, 8, 8)]  # what it did not copy over
    assert g.add(C, op("reads the copy", reads=[(0, 8)])).ready
    assert "boom" in str(g.add(D, op("reads the rest", reads=[(8, 8)])).error)


def test_a_block_handed_out_anew_is_not_poisoned():
    handed_out = []

    def take_allocations():
        taken = list(handed_out)
        handed_out.clear()
        return taken

    g = Graph(poison=Poison(take_allocations=take_allocations))
    g.finish(g.add(A, op("fails", writes=[(0, 16)])), error=ValueError("boom"))
    handed_out.append((1, 0, 16))  # the allocator hands the block to a new tensor
    assert g.add(B, op("reads the new tensor", reads=[(0, 16)])).ready


def test_a_signal_behind_a_failure_fires_failed_and_its_wait_fails_until_clear_error():
    g = Graph()
    signal = SoftSignal()
    failing = g.add(A, op("fails", writes=[(0, 8)]))
    g.add(A, Signal(signal))
    wait = g.add(B, Wait(signal))
    g.finish(failing, error=ValueError("boom"))
    assert signal.fired and "boom" in str(signal.failure)
    assert wait.done and "recorded behind a failure" in str(wait.error)
    g.graph.clear_error()
    assert signal.failure is None and not g.graph.poison.ranges
    assert g.graph.stream(A).error is None and g.graph.stream(B).error is None
    assert g.add(C, op("reads", reads=[(0, 8)])).ready


def test_clear_error_of_one_stream_keeps_the_other_streams_failures():
    g = Graph()
    g.finish(g.add(A, op("fails on A", writes=[(0, 8)])), error=ValueError("a"))
    g.finish(g.add(B, op("fails on B", writes=[(64, 8)])), error=ValueError("b"))
    g.graph.clear_error(A)
    assert g.graph.stream(A).error is None and g.graph.stream(B).error is not None
    assert g.add(C, op("reads A's", reads=[(0, 8)])).ready
    assert "ValueError: b" in str(g.add(D, op("reads B's", reads=[(64, 8)])).error)


def test_the_graph_starts_no_thread():
    before = set(threading.enumerate())
    g = Graph()
    signal = SoftSignal()
    g.add(B, Wait(signal))  # a wait for a signal not added yet (a queue would start its watchdog)
    work = g.add(A, op("work", writes=[(0, 8)]))
    g.add(A, Signal(signal))
    g.finish(work)
    assert set(threading.enumerate()) == before
