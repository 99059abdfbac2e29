"""Binding a launch's arguments to a prepared plan: checks, addresses, footprints.

Everything that depends only on the artifact is worked out once, when the
plan is prepared (`ArgTable`): each argument's dtype, shape and strides, the
element span those strides give, which arguments may alias, the layout of the
correction slots. A launch then does per-tensor work only (`ArgTable.bind`):
compare each tensor with its spec, read where its storage lives, and produce
the slot words the launch writes and the ranges the program reads and
writes.

A tensor that does not match is explained by `ArgTable.explain`, the slow
path, which names the argument and both values; nothing has been enqueued
then.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import _C
from .queue import Range
from .tensors import element_span, pieces_of, storage_ranges

# A slot of a tensor that touches no memory (empty, or over an empty storage):
# a region no allocation has, so a program that did read it would fail loudly.
NOWHERE = 1 << 62


class LaunchError(TypeError):
    """The arguments do not match the kernel's launch spec (nothing was enqueued)."""


@dataclass(frozen=True)
class ArgSpec:
    index: int
    name: str
    role: str  # input, output, inout
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    slot: int

    @property
    def written(self) -> bool:
        return self.role in ("output", "inout")


@dataclass(frozen=True)
class _Arg:
    """What a launch compares one argument with, and the numbers its span needs."""

    spec: ArgSpec
    shape: torch.Size
    itemsize: int
    numel: int
    lo: int        # its lowest and highest element, from its storage offset, with the spec's strides
    hi: int
    where: str     # how errors name it


class ArgTable:
    """The launch spec of one plan, arranged for binding (built once per plan)."""

    def __init__(self, kernel: str, device: int, args: tuple[ArgSpec, ...], slots: tuple[tuple[int, int], ...]):
        self.kernel = kernel
        self.specs = args
        self.device = torch.device("spyre", device)
        self.args = tuple(self._arg(a) for a in args)
        self._fast = tuple((a.spec.dtype, a.shape, a.spec.stride, a.numel, a.lo, a.hi, a.itemsize, a.spec.written)
                           for a in self.args)
        self.slot_of = tuple(arg for _, arg in sorted(slots))  # slot order -> argument index
        self._in_slot_order = self.slot_of == tuple(range(len(args)))
        # Only a written argument can make an unsafe alias; pairs of inputs never conflict.
        self.alias_pairs = tuple((i, j) for i, a in enumerate(args) if a.written
                                 for j in range(len(args)) if j != i)
        self._resolved: dict[tuple, tuple] = {}
        self._epoch = -1

    def _arg(self, a: ArgSpec) -> _Arg:
        probe = torch.empty_strided(a.shape, a.stride, dtype=a.dtype, device="meta")
        lo, hi = element_span(probe) if probe.numel() else (0, -1)
        return _Arg(a, torch.Size(a.shape), probe.element_size(), probe.numel(), lo, hi,
                    f"kernel {self.kernel!r} argument {a.index} ({a.name!r}, {a.role})")

    # ---- per launch ---------------------------------------------------------------------

    def check(self, args) -> tuple:
        """What a launch of `args` binds, as plain numbers, or LaunchError naming what is wrong.

        Per argument (storage address, storage bytes, offset of its first element), or None
        for an empty tensor: all a launch must read off the tensors while it holds them. The
        slot words and footprints follow from these alone (resolve), later, by whoever
        enqueues the launch; the tuple is also the key under which they are remembered.
        """
        if len(args) != len(self.args):
            self.explain(args)
        device = self.device
        bound = []
        for (dtype, shape, stride, numel, lo, hi, size, written), t in zip(self._fast, args):
            if not isinstance(t, torch.Tensor) or t.dtype != dtype or t.shape != shape or t.device != device \
                    or (t.stride() != stride and numel > 1):
                self.explain(args)  # raises, or accepts strides that differ only where they do not matter
            if numel == 0:
                bound.append(None)
                continue
            storage = t.untyped_storage()
            base, have, first = storage.data_ptr(), storage.nbytes(), t.storage_offset()
            if have < (first + hi + 1) * size:
                self.explain(args)
            bound.append((base, have, first))
        for i, j in self.alias_pairs:
            a, b = bound[i], bound[j]
            # (storages apart, the usual case, cannot overlap: one comparison before the exact test)
            if a is not None and b is not None and a[0] < b[0] + b[1] and b[0] < a[0] + a[1] and \
                    self._overlap(i, a, j, b) and not self._same(args[i], args[j], j):
                self.explain(args)
        return tuple(bound)

    def _overlap(self, i: int, a, j: int, b) -> bool:
        x, y = self.args[i], self.args[j]
        return (a[0] + (a[2] + x.lo) * x.itemsize < b[0] + (b[2] + y.hi + 1) * y.itemsize
                and b[0] + (b[2] + y.lo) * y.itemsize < a[0] + (a[2] + x.hi + 1) * x.itemsize)

    def resolve(self, bound: tuple) -> tuple[tuple[int, ...], tuple[Range, ...], tuple[Range, ...]]:
        """(slot words, ranges read, ranges written) of what check() returned.

        The words are two per slot, (region, offset of the tensor's first element); the
        ranges cover each tensor's span from its first to its last element. Remembered per
        `bound` while no region is released (a released region's address may come back
        under another handle)."""
        epoch = _C.region_epoch()
        if epoch != self._epoch:
            self._resolved.clear()
            self._epoch = epoch
        found = self._resolved.get(bound)
        if found is None:
            found = self._resolve(bound)
            if len(self._resolved) >= 256:
                self._resolved.clear()
            self._resolved[bound] = found
        return found

    def _resolve(self, bound: tuple):
        addresses, reads, writes = [], [], []
        for a, b in zip(self.args, bound):
            if b is None:
                addresses += (NOWHERE, 0)
                continue
            base, have, first = b
            pieces = pieces_of(base, have)
            region, offset, _ = pieces[0]
            size = a.itemsize
            addresses += (region, offset + first * size)
            if len(pieces) != 1 or a.lo < 0:
                touched = pieces  # several pieces, or negative strides: the whole storage
            else:
                touched = (Range(region, offset + (first + a.lo) * size, (a.hi - a.lo + 1) * size),)
            # An in-place update (inout) reads what it writes: the queue must know both (a read of
            # what a failed operation was to write fails; ordering needs only the write).
            if a.spec.role != "output":
                reads.extend(touched)
            if a.spec.written:
                writes.extend(touched)
        if not self._in_slot_order:
            addresses = [w for arg in self.slot_of for w in addresses[2 * arg: 2 * arg + 2]]
        return tuple(addresses), tuple(reads), tuple(writes)

    def bind(self, args) -> tuple[tuple[int, ...], tuple[Range, ...], tuple[Range, ...]]:
        """check() and resolve() at once."""
        return self.resolve(self.check(args))

    @staticmethod
    def _strides_agree(a: _Arg, t: torch.Tensor) -> bool:
        # The stride of a dim of one element (or of an empty tensor) does not matter.
        return a.numel <= 1 or all(x == y for x, y, n in zip(t.stride(), a.spec.stride, a.spec.shape) if n > 1)

    def _same(self, a: torch.Tensor, b: torch.Tensor, j: int) -> bool:
        """An in-place update: the written argument is the input itself, in the same layout."""
        if self.specs[j].role != "input":
            return False
        return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()

    # ---- the slow path: say what is wrong ---------------------------------------------

    def explain(self, args) -> None:
        """Raise a LaunchError naming the first argument that does not fit the spec."""
        if len(args) != len(self.args):
            names = ", ".join(a.name for a in self.specs)
            raise LaunchError(f"kernel {self.kernel!r} takes {len(self.specs)} argument(s) ({names}), "
                              f"got {len(args)}")
        for a, t in zip(self.args, args):
            spec, where = a.spec, a.where
            if not isinstance(t, torch.Tensor):
                raise LaunchError(f"{where}: expected a tensor, got {type(t).__name__}")
            if t.device != self.device:
                raise LaunchError(f"{where}: expected a tensor on {self.device}, got one on {t.device}")
            if t.dtype != spec.dtype:
                raise LaunchError(f"{where}: expected dtype {spec.dtype}, got {t.dtype}")
            if tuple(t.shape) != spec.shape:
                raise LaunchError(f"{where}: expected shape {list(spec.shape)}, got {list(t.shape)}")
            if not self._strides_agree(a, t):
                raise LaunchError(f"{where}: expected strides {list(spec.stride)}, got {list(t.stride())}")
            if t.numel() > 0:
                needed = (t.storage_offset() + a.hi + 1) * a.itemsize
                have = t.untyped_storage().nbytes()
                if have < needed:
                    raise LaunchError(f"{where}: its storage holds {have} bytes but the tensor reaches byte "
                                      f"{needed} (was the storage resized under it?)")
        for i, j in self.alias_pairs:
            raise_if_overlapping(self, args, i, j)


def raise_if_overlapping(table: ArgTable, args, i: int, j: int) -> None:
    """A written argument may share bytes with an input only as the very same tensor layout (an
    in-place update: a program reads each tile before it writes it back): an output that
    overlaps an argument elsewhere would read what it has already written, and two outputs on
    the same bytes race. Refused conservatively, by byte span (two interleaved views of one
    buffer are refused too)."""
    a, b = args[i], args[j]
    if a.numel() == 0 or b.numel() == 0:
        return
    (alo, ahi), (blo, bhi) = _host_span(a), _host_span(b)
    spec, other = table.specs[i], table.specs[j]
    same = other.role == "input" and (a.data_ptr(), a.shape, a.stride()) == (b.data_ptr(), b.shape, b.stride())
    if alo < bhi and blo < ahi and not same:
        raise LaunchError(f"kernel {table.kernel!r}: argument {spec.index} ({spec.name!r}, {spec.role}) "
                          f"overlaps argument {other.index} ({other.name!r}, {other.role}) in device "
                          f"memory without being the same tensor; pass separate buffers")


def _host_span(t: torch.Tensor) -> tuple[int, int]:
    lo, hi = element_span(t)
    base, size = t.untyped_storage().data_ptr(), t.element_size()
    return base + lo * size, base + (hi + 1) * size


def slot_words(bound) -> list[int]:
    """(region, offset) words of (tensor, ...) in slot order, for callers without a plan."""
    words = []
    for t in bound:
        if t.numel() == 0 or not storage_ranges(t.untyped_storage()):
            words.extend((NOWHERE, 0))
        else:
            whole = storage_ranges(t.untyped_storage())[0]
            words.extend((whole.region, whole.offset + t.storage_offset() * t.element_size()))
    return words

