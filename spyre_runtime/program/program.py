"""A kernel artifact: per core, one instruction stream per unit, plus its symbols.

Device buffers are symbols. Inputs and outputs are placeholders: their
addresses are written at launch into the correction area, a table at the
start of the artifact's own device allocation (one 16-byte slot per
placeholder: region, offset). Temporaries have fixed offsets in the same
allocation. The artifact's allocation is laid out as

    [correction area][temporaries][program image]

Symbolic sizes (issue 18): a program may declare size symbols (``sizes``); their values
follow the address slots in the correction area, one 8-byte word each, written at launch
and read by the same fetch. A placeholder's outermost dim (``Symbol.dims``) and a loop's trip
count (isa.Loop) may be a SizeExpr of them, clamped to a static maximum: the symbols' shapes
are the maxima, the validator proves every access at them, and at run time every transfer of
a buffer with a symbolic dim is clipped to the bytes it has at the launch's sizes.

Serialized form: a JSON document with a header (magic, format version,
checksum of the body, symbol table, correction-area offset and layout,
per-core scratchpad high-water mark) and the body (queues and programs, and
the kernel's minimum traffic when the author knows it).

The minimum traffic (``minimum_bytes``, and of it ``minimum_read_bytes``) is
what the kernel needs to move at least: every distinct input element read
once and every output element written once (the compiler computes it from
the kernel IR: spyre_inductor/compiler/core/minimum.py). It is optional:
``None`` means unknown, as in hand-written programs and artifacts written
before the field existed; such artifacts load unchanged (the keys are absent
from their body, so their checksum is the same). When known, it is part of
the body and so of the checksum, and kernel reports rate the program
against it (timing.Report: roofline, efficiency, refetch) instead of against
the bytes the program chose to move.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import numbers
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import PROGRAM_FORMAT
from . import isa
from .operands import ITEMSIZE, Addr, DevAddr, RowIndex, ScratchCount, SizeExpr, Tile, sticks

MAGIC = "spyre-program"
SLOT_BYTES = 16  # (region, offset) as two little-endian uint64
SIZE_BYTES = 8  # one size word (issue 18): a little-endian int64, after the address slots
ROLES = ("input", "output", "temp")


class ProgramFormatError(ValueError):
    """A serialized program that cannot be trusted (magic, version, checksum)."""


@dataclass(frozen=True)
class Symbol:
    """A device buffer: inputs/outputs are placeholders, temps live in the artifact."""

    name: str
    role: str
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements, as PyTorch's
    offset: int | None = None  # temps: byte offset in the artifact allocation
    # Symbolic dims (issue 18): empty, or per dim None (static) or a SizeExpr whose `hi` is that
    # dim of `shape` (the bucket's maximum). Only a placeholder's outermost dim (the largest
    # stride, spanning the others) may be symbolic: its valid bytes are then the prefix
    # [0, nbytes_at(sizes)), and every transfer of the program is clipped to it.
    dims: tuple = ()

    @property
    def nbytes(self) -> int:
        return _span_bytes(self.shape, self.strides, self.dtype)

    @property
    def sized(self) -> bool:
        return any(d is not None for d in self.dims)

    def shape_at(self, sizes) -> tuple[int, ...]:
        if not self.sized:
            return self.shape
        return tuple(n if d is None else d.value(sizes) for n, d in zip(self.shape, self.dims))

    def nbytes_at(self, sizes) -> int:
        """The bytes the buffer spans at these sizes (its maximum, nbytes, when static)."""
        return _span_bytes(self.shape_at(sizes), self.strides, self.dtype) if self.sized else self.nbytes


def _span_bytes(shape, strides, dtype) -> int:
    if any(n == 0 for n in shape):
        return 0
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    return span * ITEMSIZE[dtype]


@dataclass(frozen=True)
class Queue:
    """A bounded token queue from one (core, unit) to another."""

    name: str
    producer: tuple[int, str]
    consumer: tuple[int, str]
    depth: int = 2


@dataclass(frozen=True)
class CoreProgram:
    core: int
    units: tuple[tuple[str, tuple[isa.Instruction, ...]], ...]

    def unit(self, name: str) -> tuple[isa.Instruction, ...]:
        return dict(self.units).get(name, ())


@dataclass(frozen=True)
class Program:
    name: str
    symbols: tuple[Symbol, ...]
    cores: tuple[CoreProgram, ...]
    queues: tuple[Queue, ...] = ()
    notes: str = field(default="", compare=False)
    # What the kernel must move at least (bytes; None: unknown). See the module docstring.
    minimum_bytes: int | None = None
    minimum_read_bytes: int | None = None  # the reads' part of minimum_bytes (None: not separated)
    # Size symbols (issue 18), e.g. ("s0",): each one 8-byte word of the correction area after
    # the address slots, written at launch; buffer dims (Symbol.dims) and loop counts
    # (isa.Loop) read them through SizeExprs.
    sizes: tuple[str, ...] = ()

    def __post_init__(self):
        for what in ("minimum_bytes", "minimum_read_bytes"):
            v = getattr(self, what)
            if isinstance(v, numbers.Integral) and not isinstance(v, (bool, int)):
                object.__setattr__(self, what, int(v))  # a NumPy integer: stored (and serialized) as an int
        _check_minimum(self.name, self.minimum_bytes, self.minimum_read_bytes)

    @property
    def minimum_write_bytes(self) -> int | None:
        """The writes' part of minimum_bytes, when the reads' part is known."""
        if self.minimum_bytes is None or self.minimum_read_bytes is None:
            return None
        return self.minimum_bytes - self.minimum_read_bytes

    def symbol(self, name: str) -> Symbol:
        for s in self.symbols:
            if s.name == name:
                return s
        raise KeyError(f"program {self.name!r} has no symbol {name!r}")

    @property
    def placeholders(self) -> tuple[Symbol, ...]:
        return tuple(s for s in self.symbols if s.role in ("input", "output"))

    @property
    def correction_layout(self) -> tuple[dict, ...]:
        """One slot per placeholder (its address); the size words (`kind` "size") follow."""
        return tuple(
            {"slot": i, "symbol": s.name, "kind": "address", "offset": i * SLOT_BYTES}
            for i, s in enumerate(self.placeholders)
        )

    @property
    def size_layout(self) -> tuple[dict, ...]:
        """One 8-byte word per size symbol, after the address slots."""
        base = len(self.placeholders) * SLOT_BYTES
        return tuple({"size": name, "kind": "size", "offset": base + k * SIZE_BYTES}
                     for k, name in enumerate(self.sizes))

    @property
    def correction_offset(self) -> int:
        return 0

    @property
    def correction_bytes(self) -> int:
        return sticks(len(self.placeholders) * SLOT_BYTES + len(self.sizes) * SIZE_BYTES)

    @property
    def allocation_bytes(self) -> int:
        """Correction area and temporaries (the image is placed after them)."""
        end = self.correction_bytes
        for s in self.symbols:
            if s.role == "temp":
                end = max(end, s.offset + s.nbytes)
        return sticks(end)

    def scratchpad_high_water(self) -> dict[int, int]:
        # Computed once per (immutable) program: the header, the listing and the checks all ask.
        cached = self.__dict__.get("_high_water")
        if cached is None:
            from .validate import scratchpad_high_water

            cached = self.__dict__["_high_water"] = scratchpad_high_water(self)
        return dict(cached)

    # ---- serialized form ---------------------------------------------------------

    def image(self) -> bytes:
        """The serialized form as the device holds it (compact; computed once)."""
        cached = self.__dict__.get("_image")
        if cached is None:
            cached = self.__dict__["_image"] = self.to_json(indent=None).encode()
            self.__dict__.pop("_json", None)  # (one copy of the text is enough)
        return cached

    def to_json(self, indent: int | None = None) -> str:
        # Compact by default: json's C encoder only serves indent=None, and a many-core
        # program indented costs a third of a second per dump (listing.txt is for reading).
        # The compact text is kept: the artifact writer saves it and the device image is it.
        if indent is not None:
            return json.dumps(self._document(), indent=indent, sort_keys=True)
        cached = self.__dict__.get("_json")
        if cached is None:
            cached = self.__dict__["_json"] = json.dumps(self._document(), sort_keys=True)
        return cached

    def checksum(self) -> str:
        return self._document()["header"]["checksum"]

    def _document(self) -> dict:
        # Encoded once per (immutable) program: emission writes it and the device image reuses it.
        cached = self.__dict__.get("_doc")
        if cached is not None:
            return cached
        body = {
            "queues": [_encode(q) for q in self.queues],
            "cores": [
                {"core": c.core, "units": {u: [_encode(i) for i in instrs] for u, instrs in c.units}}
                for c in self.cores
            ],
        }
        # Only when known: a program without a minimum keeps the body (and checksum) it always had.
        if self.minimum_bytes is not None:
            body["minimum_bytes"] = self.minimum_bytes
        if self.minimum_read_bytes is not None:
            body["minimum_read_bytes"] = self.minimum_read_bytes
        body_text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        header = {
            "magic": MAGIC,
            "version": PROGRAM_FORMAT,
            "name": self.name,
            "checksum": hashlib.sha256(body_text.encode()).hexdigest(),
            "symbols": [_encode(s) for s in self.symbols],
            "correction_area": {
                "offset": self.correction_offset,
                "slot_bytes": SLOT_BYTES,
                "layout": list(self.correction_layout),
            },
            "allocation_bytes": self.allocation_bytes,
            **({"sizes": list(self.sizes), "size_layout": list(self.size_layout)} if self.sizes else {}),
            "scratchpad_high_water": {str(k): v for k, v in self.scratchpad_high_water().items()},
            "notes": self.notes,
        }
        self.__dict__["_doc"] = doc = {"header": header, "body": body}
        return doc

    @classmethod
    def from_json(cls, text: str) -> Program:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("header", {}), dict):
            raise ProgramFormatError("not a spyre program (no header)")
        header, body = doc.get("header", {}), doc.get("body", {})
        if header.get("magic") != MAGIC:
            raise ProgramFormatError(f"not a spyre program (magic {header.get('magic')!r})")
        if header.get("version") != PROGRAM_FORMAT:
            raise ProgramFormatError(
                f"program {header.get('name')!r} has format version {header.get('version')}, "
                f"this runtime reads version {PROGRAM_FORMAT}"
            )
        body_text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        found = hashlib.sha256(body_text.encode()).hexdigest()
        if found != header.get("checksum"):
            raise ProgramFormatError(f"program {header.get('name')!r}: checksum mismatch: the header records "
                                     f"{str(header.get('checksum'))[:16]}..., the body hashes to {found[:16]}... "
                                     f"(body was altered)")
        try:
            _check_minimum(header.get("name"), body.get("minimum_bytes"), body.get("minimum_read_bytes"))
        except ValueError as e:
            raise ProgramFormatError(str(e)) from None
        return cls(
            name=header["name"],
            symbols=tuple(_decode(s) for s in header["symbols"]),
            queues=tuple(_decode(q) for q in body["queues"]),
            cores=tuple(
                CoreProgram(c["core"], tuple((u, tuple(_decode(i) for i in instrs)) for u, instrs in c["units"].items()))
                for c in body["cores"]
            ),
            notes=header.get("notes", ""),
            minimum_bytes=body.get("minimum_bytes"),
            minimum_read_bytes=body.get("minimum_read_bytes"),
            sizes=tuple(header.get("sizes", ())),
        )

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        text = self.to_json()
        path.write_text(text)
        _remember(text, self)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Program:
        """The program saved at `path`. Bytes this process saved itself (the compiler writes an
        artifact, the wrapper prepares it moments later) come back, the first time they are
        loaded, as the very program that was saved, already validated, instead of being decoded
        and validated again: equal bytes are an equal program (the text is its whole serialized
        form, checksum included)."""
        text = Path(path).read_text()
        with _saved_lock:
            known = _saved.pop(_text_key(text), None)  # (handed over once: a later load decodes)
        return known if known is not None else cls.from_json(text)

    def listing(self) -> str:
        from .listing import render

        return render(self)



# Programs this process saved and has not loaded back yet, by the digest of their text
# (Program.load), the most recent last. Bounded: an artifact loaded after its entry was dropped
# is decoded from its text as any other.
_SAVED_PROGRAMS = 512
_saved: collections.OrderedDict[str, Program] = collections.OrderedDict()
_saved_lock = threading.Lock()


def _text_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _remember(text: str, program: Program) -> None:
    key = _text_key(text)
    with _saved_lock:
        _saved[key] = program
        _saved.move_to_end(key)
        while len(_saved) > _SAVED_PROGRAMS:
            _saved.popitem(last=False)


def _check_minimum(name, total, reads) -> None:
    for what, v in (("minimum_bytes", total), ("minimum_read_bytes", reads)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ValueError(f"program {name!r}: {what} must be a non-negative integer or None, got {v!r}")
    if reads is not None and (total is None or reads > total):
        raise ValueError(f"program {name!r}: minimum_read_bytes={reads!r} needs minimum_bytes at least as "
                         f"large (reads and writes together), got {total!r}")


_OPERANDS = {cls.__name__: cls for cls in (Addr, DevAddr, Tile, Symbol, Queue, RowIndex, SizeExpr, ScratchCount)}


# Per dataclass: its "@" kind and field names (the encoder's hot path: a program has thousands
# of instructions, each a few operands deep).
_ENCODING: dict[type, tuple[str, tuple[str, ...]]] = {}
_PLAIN = (int, float, str, bool, type(None))


def _encode(obj):
    cls = type(obj)
    if cls in _PLAIN:
        return obj
    shape = _ENCODING.get(cls)
    if shape is None:
        if not dataclasses.is_dataclass(obj):
            if isinstance(obj, (list, tuple)):
                return [_encode(v) for v in obj]
            return obj
        kind = obj.opcode if isinstance(obj, isa.Instruction) else cls.__name__
        shape = _ENCODING[cls] = (kind, tuple(f.name for f in dataclasses.fields(obj)))
    kind, names = shape
    out = {"@": kind}
    for name in names:
        out[name] = _encode(getattr(obj, name))
    return out


def _decode(data):
    if isinstance(data, dict) and "@" in data:
        kind = data["@"]
        cls = isa.REGISTRY.get(kind) or _OPERANDS.get(kind)
        if cls is None:
            raise ProgramFormatError(f"unknown instruction or operand {kind!r}")
        values = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                v = _decode(data[f.name])
                values[f.name] = tuple(_tuple(x) for x in v) if isinstance(v, list) and f.name in ("producer", "consumer") else _tuple(v)
        return cls(**values)
    if isinstance(data, list):
        return [_decode(v) for v in data]
    return data


def _tuple(v):
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v
