"""torch.distributed on spyre: the c10d backend "spyre".

Registered through PyTorch's public backend registration when the device registers, for
the spyre device: ``dist.init_process_group()`` with no backend named picks it when spyre
is the accelerator (as PyTorch picks nccl for cuda), and ``backend="spyre"`` names it.
One process per card: under torchrun each process sees LOCAL_WORLD_SIZE simulated cards
and the group's creation makes spyre:LOCAL_RANK current (unless the process chose a card
other than spyre:0 before). The group (process_group.py) serves spyre tensors in stream
order over gloo and CPU tensors through gloo directly.
"""

from __future__ import annotations

import torch.distributed as dist

BACKEND = "spyre"


def _create(options, backend_options=None):
    import os

    import torch

    from .process_group import SpyreProcessGroup

    # LOCAL_RANK picks the card (torchrun sets it), unless the process chose another one first.
    local = os.environ.get("LOCAL_RANK", "")
    if local.isdigit() and torch.spyre.current_device() == 0 and int(local) < torch.spyre.device_count():
        torch.spyre.set_device(int(local))

    return SpyreProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                             options.group_id)


def register() -> None:
    if not dist.is_available() or BACKEND.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["spyre"])
