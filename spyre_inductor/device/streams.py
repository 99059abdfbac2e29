"""torch.spyre streams and events (torch.cuda's names).

Stream ids, the per-thread current stream and event identity live in the C++
device guard; torch.Stream and torch.Event on "spyre" use it directly. These
classes add what torch.Stream lacks in 2.13 (priority) and spyre defaults.
"""

from __future__ import annotations

import torch

from spyre_runtime import _C

from ._index import device_index


class Stream(torch.Stream):
    """An ordered queue of work on one spyre device.

    Lower priority numbers are more urgent (as on CUDA); 0 is the default.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:
            return super().__new__(cls, **kwargs)
        return super().__new__(cls, device=torch.device("spyre", device_index(device)), priority=priority)

    @property
    def priority(self) -> int:
        return _C.stream_priority(self.device_index, self.stream_id)

    def __repr__(self) -> str:
        return f"torch.spyre.Stream(device=spyre:{self.device_index} id={self.stream_id} priority={self.priority})"


class _SpyreEventMeta(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Event) and obj.device.type == "spyre"


class Event(metaclass=_SpyreEventMeta):
    """A marker in a spyre stream; ``elapsed_time`` gives milliseconds between two.

    Constructs a plain ``torch.Event`` on spyre: torch.Event's C methods accept
    only that exact type as the other event, so a subclass would not mix with
    events made through ``torch.Event(device="spyre")``.
    """

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        return torch.Event(device="spyre", enable_timing=enable_timing,
                           blocking=blocking, interprocess=interprocess)


def _as_spyre_stream(stream: torch.Stream) -> Stream:
    return Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                  device_type=stream.device_type)


def current_stream(device=None) -> Stream:
    return _as_spyre_stream(torch.accelerator.current_stream(device_index(device)))


def default_stream(device=None) -> Stream:
    index = device_index(device)
    return Stream(stream_id=0, device_index=index,
                  device_type=torch.accelerator.current_stream(index).device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """``with torch.spyre.stream(s):`` makes ``s`` current on its device, then restores."""

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self._saved: tuple[int, torch.Stream, torch.Stream] | None = None

    def __enter__(self):
        if self.stream is None:
            return self.stream
        index = self.stream.device_index
        self._saved = (_C.current_device(), torch.accelerator.current_stream(index),
                       torch.accelerator.current_stream(_C.current_device()))
        torch.accelerator.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self._saved is None:
            return
        device, stream_on_target, stream_on_device = self._saved
        torch.accelerator.set_stream(stream_on_target)
        torch.accelerator.set_stream(stream_on_device)
        _C.set_device(device)
        self._saved = None


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def synchronize(device=None) -> None:
    """Wait until all work queued on the device has finished.

    What torch.accelerator.synchronize does (the C++ guard calls the runtime), called directly:
    the round trip through C++ lets go of the GIL, and a queue worker that takes it then runs
    the work this thread would have run itself while it waits (queue.workers.Workers.help_or_wait)."""
    from . import queues

    queues.queue(device_index(device)).synchronize()
