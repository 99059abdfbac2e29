"""spyre-inductor: the `spyre` PyTorch device and its TorchInductor backend.

Importing this package (or just ``import torch``, through the torch.backends
entry point) registers the device.
"""


def _autoload() -> None:
    """Entry point torch calls at the end of ``import torch``.

    Defined before anything imports torch: when this package is imported
    first, ``import torch`` below calls back into it while it is half-built.
    """
    from spyre_inductor.device import register

    register()


import torch  # noqa: E402,F401  (may call _autoload)

_autoload()
