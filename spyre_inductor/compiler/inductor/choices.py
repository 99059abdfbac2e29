"""SpyreChoices: Inductor's fusion heuristics, with one spyre exception for tiny kernels.

Inductor fuses two independent nodes (horizontally) only when they share at least
``score_fusion_memory_threshold`` (10) bytes of reads: fusing saves memory traffic, and that is
all a GPU kernel launch would save. On spyre every program is a launch of its own, and a
decode step is full of kernels that move a few hundred bytes (the new key and value written
into their caches, both indexed by the same positions: an 8-byte shared read). So two spyre
nodes that share any read and are both tiny (at most TINY elements each) may fuse: our
scheduling's ``can_fuse_horizontal`` still decides whether the pair captures and plans as one
program. Everything else, every other device included, is Inductor's own choice.

Installed through Inductor's ``config.inductor_choices_class`` factory hook (registration.py)
when no one has set one; its ``uuid`` keys the FX graph cache.
"""

from __future__ import annotations

from torch._inductor.choices import InductorChoices
from torch._inductor.utils import sympy_product

TINY = 4096  # elements: kernels whose launch costs more than their bytes


def _tiny_spyre(node) -> bool:
    device = node.get_device()
    if device is None or device.type != "spyre":
        return False
    try:
        numel = int(sympy_product(node.group[1]))   # (our group_fn: (numel, reduction numel))
    except (TypeError, ValueError, AttributeError):  # symbolic sizes: not known to be tiny
        return False
    return numel <= TINY


class SpyreChoices(InductorChoices):
    @staticmethod
    def can_fuse_horizontal(scheduler, node1, node2, shared_data_score: int) -> bool:
        if 0 < shared_data_score and _tiny_spyre(node1) and _tiny_spyre(node2):
            return not scheduler.are_long_distant_nodes(node1, node2)
        return InductorChoices.can_fuse_horizontal(scheduler, node1, node2, shared_data_score)

    def uuid(self) -> str:
        return f"spyre-choices-tiny-{TINY}"


def factory() -> SpyreChoices:
    return SpyreChoices()


__all__ = ["SpyreChoices", "TINY", "factory"]
