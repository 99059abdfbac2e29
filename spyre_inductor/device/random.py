"""torch.spyre random-number state: one generator per device.

A spyre generator is a Mersenne Twister like the CPU's, so seeding spyre and
CPU alike gives the same numbers.
"""

from __future__ import annotations

import torch

from spyre_runtime import _C

from ._index import device_index


def default_generator(device=None) -> torch.Generator:
    return _C.default_generator(device_index(device))


def manual_seed(seed: int) -> None:
    default_generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(_C.device_count()):
        _C.default_generator(i).manual_seed(int(seed))


def seed() -> None:
    default_generator().seed()


def seed_all() -> None:
    first = _C.default_generator(0)
    first.seed()
    for i in range(1, _C.device_count()):
        _C.default_generator(i).manual_seed(first.initial_seed())


def initial_seed() -> int:
    return default_generator().initial_seed()


def get_rng_state(device="spyre") -> torch.Tensor:
    return default_generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="spyre") -> None:
    default_generator(device).set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(_C.device_count())]


def set_rng_state_all(new_states) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
