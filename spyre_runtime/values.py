"""Host values at launch: a 0-d input carried in the correction area (issue 19, eager scalars).

A launch may give any 0-d input of a kernel as a *host value*: a CPU 0-d tensor of the
argument's dtype instead of a spyre tensor. Its bytes then travel with the launch's patch --
the same staging buffer and the same transfer that carry the address slots -- into a value
stick that follows the slots in the correction area, and the argument's slot is bound to that
stick. The program reads the value as it reads any 0-d input (it does not know the
difference), so a compiled op whose scalar is a 0-d input serves every value of that scalar
without a recompile and without a device allocation or copy per call.

Layout: a plan with 0-d inputs (and no size symbols) keeps, besides its two ordinary correction
areas, two *valued* areas in its own allocation, each

    [the program's correction area (slots, padding)][one 128-byte stick per 0-d input]

A launch that passes at least one host value patches a valued area (all of it: one transfer);
one that passes none patches an ordinary area exactly as before, so kernels whose 0-d inputs
are device tensors, and kernels without 0-d inputs, pay nothing for this. The bytes are read off
the host tensor when the launch is made (launch_jobplan), so the caller may reuse or free it
right after.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import threading

import torch

from .binding import ArgTable, LaunchError
from .program.operands import STICK

def value_inputs(args) -> tuple[int, ...]:
    """Launch-spec positions of the 0-d inputs: the arguments a launch may give as host values."""
    return tuple(i for i, a in enumerate(args) if a.role == "input" and a.shape == ())


def valued_area_bytes(program, nvalues: int) -> int:
    """A valued area: the program's correction area, then one stick per 0-d input."""
    return program.correction_bytes + nvalues * STICK


@dataclasses.dataclass(frozen=True)
class Valued:
    """What a plan with 0-d inputs needs for launches with host values (built once per plan)."""

    plan: object                        # the JobPlan these launches use: its areas are the valued ones
    values: tuple[int, ...]             # the 0-d inputs, by launch-spec position
    value_offsets: tuple[tuple[int, int], ...]  # per valued area: (region, offset of its first value stick)
    pad_words: int                      # zero words between the slots and the first value stick
    readers: tuple                      # per 0-d input: the ctypes type its value word is read as
    zeros: tuple                        # the extra words of a launch before its values are set
    tables: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # host positions -> _HostTable


class _HostTable:
    """The ArgTable of the device arguments of a launch whose `host` positions are host values:
    resolve() hands back the slot words of every slot, a host value's slot bound to its stick in
    the area the launch patches (bound: (turn, the device arguments' binding))."""

    __slots__ = ("inner", "host", "keep", "order", "offsets", "words", "readers", "_memo")

    def __init__(self, plan, host: tuple[int, ...], valued: Valued):
        specs = plan.args
        keep = [i for i in range(len(specs)) if i not in host]
        slot_arg = sorted(plan.steps[0].slots)  # (slot, argument position)
        kept_slots = [(s, a) for s, a in slot_arg if a not in host]
        position = {a: j for j, a in enumerate(keep)}
        self.inner = ArgTable(plan.name, plan.device, tuple(specs[i] for i in keep),
                              tuple((rank, position[a]) for rank, (_, a) in enumerate(kept_slots)))
        self.host = host
        self.keep = tuple(keep)
        # the extra words (zeros to the first value stick, a stick per 0-d input) and, per host
        # value, where its word goes
        self.words = tuple(valued.pad_words + valued.values.index(a) * (STICK // 8) for a in host)
        self.readers = tuple(valued.readers[valued.values.index(a)] for a in host)
        # per slot in order: None (the next two words of the device arguments) or which value stick
        self.order = tuple(valued.values.index(a) if a in host else None for _, a in slot_arg)
        self.offsets = valued.value_offsets
        self._memo: dict = {}

    def resolve(self, bound):
        turn, inner_bound = bound
        inner = self.inner.resolve(inner_bound)
        found = self._memo.get(bound)
        if found is not None and found[0] is inner:
            return found[1]  # the same object while the binding is the same (_Launch reuses its compute)
        device_words, reads, writes = inner
        region, first = self.offsets[turn]
        words, k = [], 0
        for value in self.order:
            if value is None:
                words += device_words[k:k + 2]
                k += 2
            else:
                words += (region, first + value * STICK)
        result = (tuple(words), reads, writes)
        if len(self._memo) >= 256:
            self._memo.clear()
        self._memo[bound] = (inner, result)
        return result


def host_positions(plan, args) -> tuple[int, ...]:
    """Which of the plan's 0-d inputs `args` gives as host (CPU) tensors."""
    # (per argument: a non-tensor or a missing one is the device path's to name, not its neighbours')
    return tuple(i for i in plan.values if i < len(args) and isinstance(args[i], torch.Tensor) and args[i].is_cpu)


# A value word is the value's bytes, little-endian, zero-extended to 8 bytes.
_READERS = {1: ctypes.c_uint8, 2: ctypes.c_uint16, 4: ctypes.c_uint32, 8: ctypes.c_int64}


def _refuse(plan, i: int, t: torch.Tensor) -> None:
    spec = plan.args[i]
    raise LaunchError(f"kernel {plan.name!r} argument {i} ({spec.name!r}, input): a host value must be a "
                      f"0-d CPU tensor of dtype {spec.dtype}, got {t.dtype} of shape {list(t.shape)}")


def bind_values(plan, args, host: tuple[int, ...]):
    """(the valued plan, table, bound, extra words, turn) of a launch of `plan` giving `host`
    positions as host values: the device arguments checked as any launch's are, the value words
    read off the host tensors now, the valued area it patches drawn. LaunchError, naming the
    argument, for a host value of the wrong kind."""
    valued: Valued = plan.valued
    if valued is None:
        raise LaunchError(f"kernel {plan.name!r}: host values with size symbols are not supported; pass its "
                          f"0-d inputs as spyre tensors")
    if len(args) != len(plan.args):
        plan.table.explain(args)  # (raises, naming the count)
    table = valued.tables.get(host)
    if table is None:
        table = valued.tables[host] = _HostTable(plan, host, valued)
    inner_bound = table.inner.check([args[i] for i in table.keep])
    extra = list(valued.zeros)
    for i, at, reader in zip(host, table.words, table.readers):
        t = args[i]
        if t.dtype != plan.args[i].dtype or t.dim() != 0:
            _refuse(plan, i, t)
        t = t.resolve_neg().resolve_conj()  # (its value, not its stored bits, travels)
        extra[at] = reader.from_address(t.data_ptr()).value
    extra = tuple(extra)
    derived = valued.plan
    turn = next(derived.turns) % len(derived.areas)
    return derived, table, (turn, inner_bound), extra, turn


def valued_plan(plan, areas) -> Valued:
    """The valued launches' view of `plan`: the same program, allocation and executor, its own
    two correction areas (`areas`: CorrectionArea, each valued_area_bytes long) and patch."""
    values = plan.values
    nbytes = valued_area_bytes(plan.program, len(values))
    derived = dataclasses.replace(plan, areas=tuple(areas), patch_bytes=nbytes, word_format=f"<{nbytes // 8}q",
                                  patch_name=f"{plan.name}: patch correction area (host values)",
                                  turns=itertools.count(), memo={}, last_compute=[None] * len(areas), tables={},
                                  last_patched=[None] * len(areas), lock=threading.Lock(),
                                  values=(), valued=None)
    offsets = tuple((a.address.region, a.address.offset + plan.program.correction_bytes) for a in areas)
    nslots = len(plan.program.placeholders)
    pad = plan.program.correction_bytes // 8 - 2 * nslots
    readers = tuple(_READERS[plan.args[i].dtype.itemsize] for i in values)
    return Valued(derived, values, offsets, pad, readers, (0,) * (pad + len(values) * (STICK // 8)))
