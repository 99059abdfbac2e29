"""spyre-inductor: the `spyre` PyTorch device and its TorchInductor backend.

Importing this package (or just ``import torch``, through the torch.backends
entry point) registers the device.
"""

from spyre_inductor.device import register as _register


def _autoload() -> None:
    """Entry point torch calls at the end of ``import torch``."""
    _register()


_register()
