"""Registering the spyre backend with Inductor, lazily.

``import torch`` must stay cheap, and importing Inductor costs seconds. So
nothing here runs at autoload: ``torch.spyre`` exposes the four names
Inductor's ``init_backend_registration`` reads on the first compile
(``Scheduling``, ``PythonWrapperCodegen``, ``CppWrapperCodegen``,
``WrapperFxCodegen``) through a module ``__getattr__`` that imports this
module; reading any of them runs ``register()`` once.

``register()`` hands Inductor everything in one go, through its public
registration points: the backend (scheduling and wrappers) together with a
custom pass whose uuid is our compiler version (so the FX graph cache key
changes with the compiler), the device op overrides, Dynamo's device
interface, and the spyre-conditional lowerings (lowerings.py). Inductor's
own lazy registration would then register the backend a second time
without our pass; wrapper.NoWrapper explains how that is
avoided (and tests/compiler/test_inductor_registration.py checks the key).
"""

from __future__ import annotations

import threading

import torch
from torch._inductor.codegen.common import (
    custom_backend_passes,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.custom_graph_pass import CustomGraphModulePass

from . import version

DEVICE = "spyre"
INDUCTOR_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")

_lock = threading.Lock()
_registered = False


class VersionPass(CustomGraphModulePass):
    """Our post-grad pass on graphs that touch spyre: it fuses attention (attention_fusion.py),
    and its uuid, our compiler version, is hashed into the FX graph cache key."""

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        from .attention_fusion import fuse_attention
        from .experts import install_transformers_op

        fuse_attention(gm)
        install_transformers_op()  # a custom op that may have been registered since our first compile

    def uuid(self) -> str:
        from .. import config

        return f"spyre-inductor {version.compiler_version()} {config.key()}"


VERSION_PASS = VersionPass()


def backend_classes() -> dict[str, object]:
    from .scheduling import SpyreScheduling
    from .wrapper import SpyreCppWrapperCodegen, SpyrePythonWrapperCodegen, SpyreWrapperFxCodegen

    return {
        "Scheduling": SpyreScheduling,
        "PythonWrapperCodegen": SpyrePythonWrapperCodegen,
        "CppWrapperCodegen": SpyreCppWrapperCodegen,
        "WrapperFxCodegen": SpyreWrapperFxCodegen,
    }


def _register_backend() -> None:
    classes = backend_classes()
    register_backend_for_device(
        DEVICE,
        classes["Scheduling"],
        classes["PythonWrapperCodegen"],
        classes["CppWrapperCodegen"],
        classes["WrapperFxCodegen"],
        device_custom_pass=VERSION_PASS,
    )


def register() -> None:
    """Register everything Inductor and Dynamo need for spyre (idempotent)."""
    global _registered
    with _lock:
        if _registered:
            return
        from torch._dynamo.device_interface import register_interface_for_device

        from .device_interface import SpyreInterface
        from .convolution_lowering import install as install_convolution
        from .device_op_overrides import SpyreDeviceOpOverrides
        from .loop_order import install as install_loop_order
        from .lowerings import install as install_lowerings

        _register_backend()
        install_lowerings()
        install_convolution()  # conv2d as a patch gather and a matmul (convolution_lowering.py)
        install_loop_order()  # a pre-fusion scheduler pass (loop_order.py: dim-0 reductions fuse)
        from torch._inductor import config as inductor_config

        from . import choices

        if inductor_config.inductor_choices_class is None:  # (a user's own heuristics stay theirs)
            inductor_config.inductor_choices_class = choices.factory
        register_device_op_overrides(DEVICE, SpyreDeviceOpOverrides())
        register_interface_for_device(DEVICE, SpyreInterface)
        for index in range(torch.spyre.device_count()):
            register_interface_for_device(f"{DEVICE}:{index}", SpyreInterface)
        _registered = True


def version_in_cache_key() -> bool:
    """Whether the FX graph cache key currently carries our version."""
    return custom_backend_passes.get(DEVICE) is VERSION_PASS


def inductor_attribute(name: str):
    """What ``torch.spyre.<name>`` returns for the four names Inductor reads."""
    register()
    return backend_classes()[name]
