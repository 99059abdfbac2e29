"""The one hardware-config object: every Spyre figure the project uses.

Each value says where it comes from (see ../shared/SPYRE_MEASUREMENTS.md):
M = measured on a card, F = fitted to measurements, E = datasheet or estimate.
Override for experiments with ``dataclasses.replace(HARDWARE, ...)`` or, for
the device itself, the environment variables named below (read once, when the
device is first registered; a value that cannot be used is reported with a
SpyreConfigWarning and the default is used instead).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30


def _figure(value, source: str, programs: bool = True):
    """`programs`: whether a compiled program may depend on it (artifact keys include only those)."""
    return field(default=value, metadata={"source": source, "programs": programs})


@dataclass(frozen=True)
class HardwareConfig:
    name: str = _figure("IBM Spyre (simulated)", "")
    cores: int = _figure(32, "E: 32 cores on a bidirectional ring")
    corelets_per_core: int = _figure(2, "E: 2 corelets per core sharing one scratchpad")
    clock_ghz: float = _figure(1.5, "E: 1.5 GHz")
    stick_bytes: int = _figure(128, "E: 128-byte words are the unit of data movement")
    scratchpad_bytes: int = _figure(2 * MIB, "E: 2 MiB per core")
    scratchpad_reserved_bytes: int = _figure(64 * KIB, "E: 64 KiB reserved for program/debug")
    device_memory_bytes: int = _figure(128 * GIB, "E: LPDDR5, 128 GB per card")
    device_memory_gbps_nominal: float = _figure(204.8, "E: LPDDR5 nominal")
    device_memory_gbps_sustained: float = _figure(150.0, "M/F: pure reads or pure writes")
    device_memory_gbps_mixed: float = _figure(105.0, "M/F: balanced read+write stream")
    bus_ceiling: tuple = _figure(
        ((1, 0.11), (2, 0.22), (4, 0.43), (8, 0.54), (16, 0.54), (32, 0.72)),
        "M: fraction of the nominal bus reached with n transfers in flight: reductions on 1, 2, 4, 8-16 cores "
        "(one transfer per core); 32: the row sum (16 MiB in 113.3 us); interpolated between, "
        "the sustained caps beyond")
    core_dma_gbps: float = _figure(
        67.0, "F: the most one core's transfers were measured to move: add on 1 core, 96 MiB in 1499 us; "
              "the model lets no core go faster, however many transfers it keeps in flight")
    matrix_macs_per_ns_per_core: float = _figure(1140.0, "F: sustained fp16 MACs per ns per core")
    pe_fill: tuple = _figure(
        ((1, 0.5), (2, 0.5), (8, 0.72), (64, 1.0)),
        "F: PE fill efficiency by rows per core: 0.50 at 2 rows, 0.72 at 8, full from 64 (8 rows x 8 passes)")
    sfp_sticks_per_us_per_core: float = _figure(
        1760.0, "F: special-function results per us per core, a result being one 128-byte stick (64 fp16 lanes): "
                "the resident dim-0 softmax (5 passes over 8192 sticks) measures 23.67 us")
    transpose_gbps_per_core: float = _figure(40.0, "M: on-chip transpose, about 40 GB/s per core")
    core_span_bytes: int = _figure(256 * MIB, "E: per-core addressable span, 256 MB of device memory per tensor "
                                              "slice: the bytes one core's accesses to one tensor may spread over")
    ring_bytes_per_cycle: int = _figure(128, "E: per direction")
    ring_hop_ns: float = _figure(5.0, "E: about 5 ns per hop")
    host_link_gbps: float = _figure(
        25.0, "E: host<->card transfers over PCIe Gen4 x16 (~32 GB/s nominal); an estimate, no measurement yet"
    )
    card_link_gbps: float = _figure(
        25.0, "E: card-to-card bytes per ns per direction: PCIe peer-to-peer through the drawer's switch, the same "
              "Gen4 x16 lanes as the host link (~32 GB/s nominal); an estimate, no measurement yet "
              "(SPYRE_LINK_GBPS overrides it)", programs=False)
    card_link_latency_us: float = _figure(
        5.0, "E: per message on the card-to-card link: a DMA descriptor and a PCIe round trip through the "
             "switch; an estimate, no measurement yet (SPYRE_LINK_LATENCY_US overrides it)", programs=False)
    burst_sticks: int = _figure(32, "E: bursts of at most 32 words (4 KB)")
    region_handles_pf: int = _figure(256, "E: region handles per card when dedicated (PF mode)")
    region_handles_vf: int = _figure(16, "E: region handles per card when shared (VF mode)")

    def __post_init__(self):
        # An override for an experiment should fail here, naming the figure, not as a division
        # by zero deep in the timing model.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or f.name == "name":
                continue
            if isinstance(value, (int, float)) and not value > 0:
                raise ValueError(f"HardwareConfig.{f.name} must be positive, got {value!r}")
            if isinstance(value, tuple):
                xs = [p[0] for p in value] if all(isinstance(p, tuple) and len(p) == 2 for p in value) else None
                if not xs or xs != sorted(set(xs)) or not all(p[1] > 0 for p in value):
                    raise ValueError(f"HardwareConfig.{f.name} must be a non-empty table of (x, value > 0) "
                                     f"pairs with increasing x, got {value!r}")
        if self.scratchpad_reserved_bytes >= self.scratchpad_bytes:
            raise ValueError(f"HardwareConfig.scratchpad_reserved_bytes ({self.scratchpad_reserved_bytes}) must be "
                             f"less than scratchpad_bytes ({self.scratchpad_bytes})")

    @property
    def scratchpad_usable_bytes(self) -> int:
        return self.scratchpad_bytes - self.scratchpad_reserved_bytes

    def program_figures(self) -> dict:
        """The figures a compiled program may depend on (the card-to-card link prices collectives only)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get("programs", True)}

    def sources(self) -> dict[str, str]:
        """Each figure's provenance, for documentation and reports."""
        return {f.name: f.metadata.get("source", "") for f in dataclasses.fields(self)}


HARDWARE = HardwareConfig()


# The device registers on `import torch` (the torch.backends entry point), so a
# bad value here must not raise: that would make torch itself unimportable.
# Each reader warns, naming the variable, the bad value and the default, and
# uses the default.


class SpyreConfigWarning(UserWarning):
    """A SPYRE_* environment variable held a value that cannot be used."""


def _warn_default(name: str, raw: str, what: str, default) -> None:
    import warnings

    warnings.warn(f"spyre: {name}={raw!r} is not {what}; using the default {default}",
                  SpyreConfigWarning, stacklevel=3)


def _number_from_env(name: str, default, parse, valid, what: str):
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = parse(raw.strip())
    except ValueError:
        value = None
    if value is None or not valid(value):
        _warn_default(name, raw, what, default)
        return default
    return value


def wait_timeout_from_env() -> float:
    """SPYRE_WAIT_TIMEOUT: seconds a stream waits for a signal that was never enqueued (default 60)."""
    return _number_from_env("SPYRE_WAIT_TIMEOUT", 60.0, float, lambda v: 0 < v < float("inf"),
                            "a positive, finite number of seconds")


def mode_from_env() -> str:
    """SPYRE_MODE: "pf" (card dedicated, the default) or "vf" (card shared)."""
    raw = os.environ.get("SPYRE_MODE")
    if raw is None:
        return "pf"
    mode = raw.strip().lower()
    if mode not in ("pf", "vf"):
        _warn_default("SPYRE_MODE", raw, "'pf' or 'vf'", "pf")
        return "pf"
    return mode


def region_handles(mode: str, hardware: HardwareConfig = HARDWARE) -> int:
    return hardware.region_handles_pf if mode == "pf" else hardware.region_handles_vf


def device_count_from_env() -> int:
    """SPYRE_NUM_DEVICES: how many simulated cards. By default 1, or under torchrun (which sets
    LOCAL_WORLD_SIZE) one per local process, as a host with that many cards would show each of
    them: rank LOCAL_RANK then takes spyre:LOCAL_RANK."""
    if "SPYRE_NUM_DEVICES" in os.environ:
        return _number_from_env("SPYRE_NUM_DEVICES", 1, int, lambda v: 1 <= v <= 64, "an integer between 1 and 64")
    return _number_from_env("LOCAL_WORLD_SIZE", 1, int, lambda v: 1 <= v <= 64, "an integer between 1 and 64")


def link_from_env(hardware: HardwareConfig = HARDWARE) -> HardwareConfig:
    """The hardware with the card-to-card link's figures SPYRE_LINK_GBPS and SPYRE_LINK_LATENCY_US
    (each process of a distributed run reads its own environment, so torchrun passes them on)."""
    positive = lambda v: 0 < v < float("inf")  # noqa: E731
    gbps = _number_from_env("SPYRE_LINK_GBPS", hardware.card_link_gbps, float, positive,
                            "a positive, finite number of GB/s")
    latency = _number_from_env("SPYRE_LINK_LATENCY_US", hardware.card_link_latency_us, float, positive,
                               "a positive, finite number of microseconds")
    return dataclasses.replace(hardware, card_link_gbps=gbps, card_link_latency_us=latency)


def preparation_streams_from_env() -> int:
    """SPYRE_PREPARATION_STREAMS: streams per compute stream that patch launches' correction
    areas (default 1; 0 patches on the compute stream itself, one stream per launch)."""
    return _number_from_env("SPYRE_PREPARATION_STREAMS", 1, int, lambda v: 0 <= v <= 8,
                            "an integer between 0 and 8")
