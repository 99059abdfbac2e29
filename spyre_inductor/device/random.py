"""torch.spyre random-number state: the device generators and their Philox state.

Random fills run in spyre programs (issue 19): element i of a call draws Philox-4x32-10 at
(key = the generator's seed, counter = its offset + i) (spyre_runtime/program/philox.py), and
the call advances the offset by the counters it used, as CUDA's Philox generator does. So the
numbers depend only on (seed, offset): seeded, reproducible, independent of the CPU
generator's state, and a compiled graph can take them as plain integers.

Where the state lives: in the C++ generator itself (spyre_runtime/csrc/hooks.cpp), beside the
Mersenne Twister that serves the ops still on the CPU fallback (multinomial, randperm above its
in-program limit, ...). So every way of seeding or restoring a generator replays exactly, as on
CUDA, for the default generators and ``torch.Generator(device="spyre")`` objects alike:
``manual_seed`` (any seed, the same one again too) and ``seed`` restart the offset at 0;
``get_state``/``set_state`` (and ``torch.spyre.get_rng_state``/``set_rng_state``, and
``torch.random.fork_rng``, which uses them) carry the seed, the offset and the Twister;
``get_offset``/``set_offset`` read and set the offset.

State tensor (uint8): 16 bytes of Philox state (seed and offset, little-endian int64), then
the Mersenne Twister's state.
"""

from __future__ import annotations

import threading

import torch

from spyre_runtime import _C

from ._index import device_index

PHILOX_BYTES = 16  # spyre_runtime/csrc/hooks.h kPhiloxStateBytes

_lock = threading.Lock()  # guards the table below (a leaf lock)
_default_wrappers: dict[int, torch.Generator] = {}


def default_generator(device=None) -> torch.Generator:
    """The device's default generator, always the same Python object."""
    index = device_index(device)
    with _lock:
        gen = _default_wrappers.get(index)
        if gen is None:
            gen = _default_wrappers[index] = _C.default_generator(index)
        return gen


def _generator_for(generator: torch.Generator | None, index: int) -> torch.Generator:
    if generator is None:
        return default_generator(index)
    if generator.device.type != "spyre":
        raise RuntimeError(f"Expected a 'spyre' device type for generator but found '{generator.device.type}'")
    if generator.device.index is not None and generator.device.index != index:
        raise RuntimeError(f"a generator of {generator.device} cannot draw for a tensor on spyre:{index}")
    return generator


def reserve(generator: torch.Generator | None, device: torch.device, counters: int) -> tuple[int, int]:
    """(key, offset) for a call that draws `counters` Philox counters, advancing the offset past
    them (one atomic step in the generator): the call's element i uses counter offset + i. The
    key is the seed as a signed int64."""
    index = device.index if device.index is not None else _C.current_device()
    seed, offset = _C.philox_reserve(_generator_for(generator, index), int(counters))
    return _signed(seed), offset


def _signed(seed: int) -> int:
    return seed - (1 << 64) if seed >= 1 << 63 else seed


def philox_state(device=None) -> tuple[int, int]:
    """(seed, offset) of a device's default generator, without drawing (tests, debugging)."""
    gen = default_generator(device)
    return gen.initial_seed(), gen.get_offset()


def twister_state(generator: torch.Generator) -> torch.Tensor:
    """The Mersenne Twister part of a spyre generator's state: what a CPU generator takes, for
    the ops the CPU fallback runs with it."""
    return generator.get_state()[PHILOX_BYTES:].clone()  # (a CPU generator reads a view from its storage start)


def set_twister_state(generator: torch.Generator, twister: torch.Tensor) -> None:
    """Set the Mersenne Twister part of a spyre generator's state, its Philox part kept (one step
    under the generator's lock: a Philox draw by another thread meanwhile is not undone)."""
    _C.set_twister_state(generator, twister.to("cpu", torch.uint8).contiguous())


def manual_seed(seed: int) -> None:
    default_generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(_C.device_count()):
        default_generator(i).manual_seed(int(seed))


def seed() -> None:
    default_generator(None).seed()


def seed_all() -> None:
    first = default_generator(0)
    first.seed()
    for i in range(1, _C.device_count()):
        default_generator(i).manual_seed(first.initial_seed())


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="spyre") -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="spyre") -> None:
    default_generator(device).set_state(new_state.to("cpu", torch.uint8).contiguous())


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(_C.device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
