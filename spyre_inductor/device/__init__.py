"""The PyTorch-facing spyre device: PrivateUse1 renamed, torch.spyre, fallback.

``register()`` is all it takes; it runs on ``import spyre_inductor`` and, via
the ``torch.backends`` entry point, on plain ``import torch``. It must stay
cheap: load the C++ extension, name the device, nothing heavy (no Inductor).
"""

from __future__ import annotations

import torch

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    from spyre_runtime import _C
    from spyre_runtime.hardware import HARDWARE, device_count_from_env, mode_from_env, region_handles

    from . import api, asserts, autocast, copies, fallback, profiler, queues, random_ops, routes

    mode = mode_from_env()
    _C.configure(device_count_from_env(), HARDWARE.device_memory_bytes, region_handles(mode), mode)
    if torch._C._get_privateuse1_backend_name() != "spyre":
        torch.utils.rename_privateuse1_backend("spyre")
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    if not hasattr(torch, "spyre"):
        torch._register_device_module("spyre", api)
    # TORCH_LOGS="spyre" (plans and fallbacks, INFO) or "+spyre" (DEBUG): registered before torch
    # reads TORCH_LOGS (autoload runs first in torch/__init__)
    from torch._logging._internal import register_log

    register_log("spyre", ["spyre_inductor", "spyre_runtime"])
    queues.install()
    copies.install()
    asserts.install()  # torch._assert_async: a check in stream order
    fallback.install()
    profiler.install()  # torch.profiler's spyre activities (a Kineto plugin)
    routes.install()  # meta kernels of the convolutions PyTorch hands a device
    random_ops.install()  # random fills in spyre programs (issue 19)
    autocast.install()  # cast rules for torch.autocast("spyre") (issue 19)
    from spyre_inductor import distributed

    distributed.register()  # the c10d backend "spyre" (torch.distributed)
    from spyre_inductor import eager  # compile-backed eager kernels (no Inductor import until a first call)

    eager.install()
    _registered = True
