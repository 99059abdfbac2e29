"""Errors reach the user as what they are.

Pins two faults:

* an exception raised by the queue layer while PyTorch waits on the device
  (synchronize, a stream's or an event's synchronize, a stream query) comes out
  of the C++ guard as the original Python exception, with its type and message:
  a failed operation is a spyre_runtime.queue.StreamError, and Ctrl-C during a
  wait is a KeyboardInterrupt, not ``RuntimeError: KeyboardInterrupt: <EMPTY
  MESSAGE>`` with a C++ trace;
* a bad SPYRE_* environment value cannot break ``import torch`` (the device
  registers at import through the torch.backends entry point): it warns,
  naming the variable, the bad value and the default, and uses the default.
"""

import time

import pytest
import torch

from conftest import run_python

from spyre_inductor.device import queues
from spyre_runtime.queue import HostCallback
from spyre_runtime.queue.tickets import StreamError


# ---- a failed operation's error keeps its type through synchronize ---------------


@pytest.fixture
def failed_stream():
    """A stream whose operation 'exploding callback' raised ValueError('bad bytes')."""
    s = torch.spyre.Stream()

    def boom():
        raise ValueError("bad bytes")

    ticket = queues.queue(0).enqueue(s.stream_id, HostCallback(boom, name="exploding callback"))
    deadline = time.monotonic() + 30
    while not ticket.done and time.monotonic() < deadline:  # it has failed: query() knows too
        time.sleep(0.001)
    yield s
    torch.spyre.clear_errors()
    torch.spyre.synchronize()


def _check_stream_error(info):
    err = info.value
    assert type(err) is StreamError
    assert "exploding callback" in str(err) and "ValueError: bad bytes" in str(err)
    assert "At:" not in str(err)  # no C++ trace glued onto the message
    assert isinstance(err.__cause__, ValueError)  # the operation's own exception is kept


@pytest.mark.parametrize("wait", [
    pytest.param(lambda s: torch.spyre.synchronize(), id="torch.spyre.synchronize"),
    pytest.param(lambda s: torch.accelerator.synchronize(), id="torch.accelerator.synchronize"),
    pytest.param(lambda s: s.synchronize(), id="stream.synchronize"),
    pytest.param(lambda s: s.query(), id="stream.query"),
])
def test_a_failed_operation_surfaces_as_a_stream_error(failed_stream, wait):
    """Every way of waiting for (or asking about) a failed stream raises the queue
    layer's StreamError itself, so ``except StreamError`` works."""
    with pytest.raises(StreamError) as info:
        wait(failed_stream)
    _check_stream_error(info)


def test_an_event_behind_a_failed_operation_raises_the_stream_error(failed_stream):
    """An event recorded after the failed operation is skipped; synchronizing on it
    says why, with the same StreamError."""
    event = torch.Event(device="spyre")
    event.record(failed_stream)
    with pytest.raises(StreamError) as info:
        event.synchronize()
    _check_stream_error(info)


def test_the_first_synchronize_of_a_process_waits():
    """torch.accelerator.synchronize(i) returns at once while torch thinks the device is
    not yet lazily initialized, which for spyre was the case until something created a
    tensor or asked for the current device. torch.spyre.synchronize() passes an index,
    so in a fresh process it skipped the wait, and the first failure went unreported."""
    result = run_python(
        "import time, torch\n"
        "from spyre_inductor.device import queues\n"
        "from spyre_runtime.queue import HostCallback, StreamError\n"
        "done = []\n"
        "def slow():\n"
        "    time.sleep(0.3)\n"
        "    done.append(True)\n"
        "    raise ValueError('bad bytes')\n"
        "queues.queue(0).enqueue(0, HostCallback(slow, name='first op'))\n"
        "try:\n"
        "    torch.spyre.synchronize()\n"
        "    print('returned', done)\n"
        "except StreamError as e:\n"
        "    print('StreamError', done)\n",
        SPYRE_NUM_DEVICES=1,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["StreamError", "[True]"]


# ---- Ctrl-C during a wait -------------------------------------------------------------

_INTERRUPTED_WAIT = """
import faulthandler, signal, sys, threading, time, torch
from spyre_inductor.device import queues
from spyre_runtime.queue import HostCallback

faulthandler.dump_traceback_later(90, exit=True)  # a hang shows every thread's stack
# A user's Ctrl-C in an interactive process: the default handler, SIGINT not blocked, whatever
# this child inherited from the test runner (an ignored or blocked SIGINT is inherited through
# fork and exec); what it inherited is said on a hang
print("inherited SIGINT:", signal.getsignal(signal.SIGINT), "blocked:",
      signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []), file=sys.stderr, flush=True)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

def blocked_in_a_device_wait(ident):
    # The main thread sleeps in a lock's wait called from the runtime's queue: the
    # moment a user's Ctrl-C is meant to find it in (a timer would race with a
    # loaded machine and land before or after the wait).
    frame, names = sys._current_frames().get(ident), []
    while frame is not None:
        names.append((frame.f_code.co_filename, frame.f_code.co_name))
        frame = frame.f_back
    return (bool(names) and names[0][0].endswith("threading.py")
            and any("spyre_runtime" in f for f, _ in names))

def ctrl_c_once_waiting(ident, stop):
    while not stop.is_set():
        if blocked_in_a_device_wait(ident):
            signal.pthread_kill(ident, signal.SIGINT)
            return
        time.sleep(0.005)

def interrupted(wait):
    s = torch.spyre.Stream()
    release = threading.Event()
    queues.queue(0).enqueue(s.stream_id, HostCallback(lambda: release.wait(60), name="slow callback"))
    event = torch.Event(device="spyre")
    event.record(s)
    stop = threading.Event()
    sender = threading.Thread(target=ctrl_c_once_waiting, args=(threading.main_thread().ident, stop))
    sender.start()
    try:
        wait(s, event)
        outcome = "returned without waiting"
    except KeyboardInterrupt as e:
        outcome = f"KeyboardInterrupt {str(e)!r}"
    except BaseException as e:
        outcome = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    finally:
        stop.set()
        sender.join()
        release.set()
    torch.spyre.synchronize()  # the device is still usable afterwards
    return outcome

print(interrupted(lambda s, e: torch.spyre.synchronize()), flush=True)
print(interrupted(lambda s, e: torch.accelerator.synchronize()), flush=True)
print(interrupted(lambda s, e: s.synchronize()), flush=True)
print(interrupted(lambda s, e: e.synchronize()), flush=True)
"""


def test_ctrl_c_during_a_wait_raises_keyboard_interrupt():
    """A user pressing Ctrl-C while the host waits for the device gets a
    KeyboardInterrupt (so ``except KeyboardInterrupt`` and the REPL behave), from
    each kind of wait. The interrupted wait leaves the device usable."""
    result = run_python(_INTERRUPTED_WAIT, SPYRE_NUM_DEVICES=1)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines() == ["KeyboardInterrupt ''"] * 4, result.stdout


# ---- bad environment values -----------------------------------------------------------------


@pytest.mark.parametrize("name, value, default, check", [
    ("SPYRE_NUM_DEVICES", "abc", "1", "torch.spyre.device_count()"),
    ("SPYRE_NUM_DEVICES", "0", "1", "torch.spyre.device_count()"),
    ("SPYRE_MODE", "xx", "pf", "torch.spyre.memory_stats()['mode']"),
    ("SPYRE_WAIT_TIMEOUT", "-1", "60", "queues.runtime().queue(0).wait_timeout"),
    ("SPYRE_WAIT_TIMEOUT", "soon", "60", "queues.runtime().queue(0).wait_timeout"),
])
def test_a_bad_environment_value_warns_and_uses_the_default(name, value, default, check):
    """``import torch`` loads the device; a typo in a SPYRE_* variable must not make
    torch itself unusable. The warning says which variable, what it held and what
    is used instead."""
    result = run_python(
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "import torch\n"
        "from spyre_inductor.device import queues\n"
        f"print({check})\n"
        "print(torch.ones(2, device='spyre').sum().item())\n",
        **{"SPYRE_NUM_DEVICES": "1", name: value},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [default if name != "SPYRE_WAIT_TIMEOUT" else "60.0", "2.0"]
    assert name in result.stderr and repr(value) in result.stderr
    assert f"using the default {default}" in result.stderr


def test_good_environment_values_do_not_warn():
    """Valid values (with stray spaces or capitals in the mode) are used silently."""
    result = run_python(
        "import warnings\n"
        "warnings.simplefilter('error')\n"
        "import torch\n"
        "from spyre_inductor.device import queues\n"
        "print(torch.spyre.device_count(), torch.spyre.memory_stats()['mode'], queues.runtime().queue(0).wait_timeout)\n",
        SPYRE_NUM_DEVICES="3", SPYRE_MODE=" VF ", SPYRE_WAIT_TIMEOUT="2.5",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "vf", "2.5"]
