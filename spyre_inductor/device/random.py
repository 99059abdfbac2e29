"""torch.spyre random-number state: one counter-based (Philox) generator state per generator.

Random fills run in spyre programs (issue 19): element i of a call draws Philox-4x32-10 at
(key = the generator's seed, counter = its offset + i) (spyre_runtime/program/philox.py), and
the call advances the offset by the counters it used, as CUDA's Philox generator does. So the
numbers depend only on (seed, offset): seeded, reproducible, independent of the CPU
generator's state, and a compiled graph can take them as plain integers.

Where the state lives, and why there: the C++ generator (spyre_runtime/csrc/hooks.cpp, a
Mersenne Twister that says it belongs to a spyre device) cannot learn a Philox offset without
a rebuild. So (seed, offset) live here, in Python, beside it: the seed is always the C++
generator's ``initial_seed()`` (what ``manual_seed``/``seed`` set, whichever API set it), the
offset is ours. The C++ generator keeps serving the ops that still run on the CPU fallback
(multinomial, randperm above its in-program limit, ...): they draw from its Mersenne Twister, and the state tensors below
carry both, so save/restore covers every op.

* ``torch.spyre.manual_seed``/``manual_seed_all``/``seed``/``seed_all``/``set_rng_state`` and
  ``torch.manual_seed`` (through manual_seed_all) reset or set the offset.
* Explicit generators (``torch.Generator(device="spyre")`` passed to an op) get their own
  (seed, offset); each one an op was given is kept alive for the process (see _explicit).
* A generator reseeded through its own method (``g.manual_seed(s)``) is noticed when its
  initial seed changes (the offset restarts at 0); reseeding it with the very seed it already
  had does not restart the offset (nothing tells us): use ``torch.spyre.manual_seed`` for the
  default generators, or a fresh ``torch.Generator(device="spyre")``.
* ``g.get_state()``/``g.set_state()`` on a Generator object carry only the C++ part; the
  torch.spyre functions (and ``torch.random.fork_rng``, which uses them) carry both.

State tensor (uint8): 16 bytes of Philox state (seed and offset, little-endian int64), then
the C++ generator's own state.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from spyre_runtime import _C

from ._index import device_index

PHILOX_BYTES = 16


@dataclass
class PhiloxState:
    seed: int     # the C++ generator's initial_seed() when the offset was last (re)started
    offset: int   # counters drawn since


_lock = threading.Lock()  # guards every PhiloxState and the tables below (a leaf lock)
_default_wrappers: dict[int, torch.Generator] = {}
_default_states: dict[int, PhiloxState] = {}
# Generators passed to ops explicitly, by the wrapper the op received, with their state. The
# binding gives a Python kernel a new wrapper of a generator unless one is alive (it then reuses
# it), so keeping the wrapper here is what makes the next call see the same object: each spyre
# Generator an op was given stays alive for the process (a few KB; they are rarely many).
_explicit: dict[int, tuple[torch.Generator, PhiloxState | None]] = {}
_aliases: dict[int, tuple[torch.Generator, int]] = {}  # wrappers of a default generator -> its device


def default_generator(device=None) -> torch.Generator:
    """The device's default generator, always the same Python object."""
    index = device_index(device)
    with _lock:
        return _default_generator_locked(index)


def _fresh(state: PhiloxState | None, gen: torch.Generator) -> PhiloxState:
    # (under _lock) The state, restarted if the generator was reseeded behind our back.
    seed = gen.initial_seed()
    if state is None or state.seed != seed:
        state = PhiloxState(seed, 0)
    return state


def _state_of(generator: torch.Generator | None, index: int) -> PhiloxState:
    """(under _lock) The Philox state an op on spyre:`index` draws from, stored back."""
    if generator is None:
        state = _default_states[index] = _fresh(_default_states.get(index), _default_generator_locked(index))
        return state
    if generator.device.type != "spyre":
        raise RuntimeError(f"Expected a 'spyre' device type for generator but found '{generator.device.type}'")
    if generator.device.index is not None and generator.device.index != index:
        raise RuntimeError(f"a generator of {generator.device} cannot draw for a tensor on spyre:{index}")
    key = id(generator)
    alias = _aliases.get(key)
    if alias is not None and alias[0] is generator:
        return _state_of(None, alias[1])
    entry = _explicit.get(key)
    if entry is None or entry[0] is not generator:
        if _is_default(generator, index):
            _aliases[key] = (generator, index)
            return _state_of(None, index)
        entry = (generator, None)
    state = _fresh(entry[1], generator)
    _explicit[key] = (generator, state)
    return state


def _default_generator_locked(index: int) -> torch.Generator:
    gen = _default_wrappers.get(index)
    if gen is None:
        gen = _default_wrappers[index] = _C.default_generator(index)
    return gen


def _is_default(generator: torch.Generator, index: int) -> bool:
    """(under _lock) Whether `generator` wraps device `index`'s default generator: no identity
    crosses the binding, so it is probed: the default generator is the one whose seed changes
    when the default's does (its state restored after). Once per wrapper, only for wrappers
    with the default's seed."""
    default = _default_generator_locked(index)
    if generator.initial_seed() != default.initial_seed():
        return False
    saved = default.get_state()
    try:
        default.manual_seed(default.initial_seed() ^ 1)
        return generator.initial_seed() == default.initial_seed()
    finally:
        default.set_state(saved)


def reserve(generator: torch.Generator | None, device: torch.device, counters: int) -> tuple[int, int]:
    """(key, offset) for a call that draws `counters` Philox counters, advancing the offset past
    them: the call's element i uses counter offset + i. The key is the seed as a signed int64."""
    index = device.index if device.index is not None else _C.current_device()
    with _lock:
        state = _state_of(generator, index)
        offset = state.offset
        state.offset += int(counters)
        seed = state.seed
    return _signed(seed), offset


def _signed(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def philox_state(device=None) -> tuple[int, int]:
    """(seed, offset) of a device's default generator, without drawing (tests, debugging)."""
    index = device_index(device)
    with _lock:
        state = _default_states[index] = _fresh(_default_states.get(index), _default_generator_locked(index))
        return state.seed, state.offset


def _restart(index: int, offset: int = 0) -> None:
    with _lock:
        _default_states[index] = PhiloxState(_default_generator_locked(index).initial_seed(), int(offset))


def manual_seed(seed: int) -> None:
    index = device_index(None)
    default_generator(index).manual_seed(int(seed))
    _restart(index)


def manual_seed_all(seed: int) -> None:
    for i in range(_C.device_count()):
        default_generator(i).manual_seed(int(seed))
        _restart(i)


def seed() -> None:
    index = device_index(None)
    default_generator(index).seed()
    _restart(index)


def seed_all() -> None:
    first = default_generator(0)
    first.seed()
    _restart(0)
    for i in range(1, _C.device_count()):
        default_generator(i).manual_seed(first.initial_seed())
        _restart(i)


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="spyre") -> torch.Tensor:
    index = device_index(device)
    seed, offset = philox_state(index)
    philox = torch.tensor([_signed(seed), offset], dtype=torch.int64)
    return torch.cat([philox.view(torch.uint8), default_generator(index).get_state()])


def set_rng_state(new_state: torch.Tensor, device="spyre") -> None:
    index = device_index(device)
    gen = default_generator(index)
    new_state = new_state.to("cpu", torch.uint8).contiguous()
    if new_state.numel() <= PHILOX_BYTES:
        raise ValueError(f"a spyre RNG state has {PHILOX_BYTES} bytes of Philox state and then the generator's "
                         f"own; got {new_state.numel()} bytes")
    seed, offset = (int(v) for v in new_state[:PHILOX_BYTES].clone().view(torch.int64))
    gen.set_state(new_state[PHILOX_BYTES:].clone())
    if gen.initial_seed() != seed % (1 << 64):
        raise ValueError("inconsistent spyre RNG state: its Philox seed is not its generator's seed")
    _restart(index, offset)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(_C.device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
