# Builds the C++ part of the spyre device (spyre_runtime._C). Everything else
# is plain Python and is described in pyproject.toml.
import os
from pathlib import Path

from setuptools import setup

# torch autoloads installed device backends on import, and an editable
# install of this package would load its stale (or missing) extension.
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
from torch.utils.cpp_extension import BuildExtension, CppExtension, include_paths

csrc = Path("spyre_runtime") / "csrc"

setup(
    ext_modules=[
        CppExtension(
            "spyre_runtime._C",
            sources=sorted(str(p) for p in csrc.glob("*.cpp")),
            # Kineto's headers (shipped with torch, not on the default path): profiler.cpp's plugin
            include_dirs=[str(Path(include_paths()[0]) / "kineto")],
            extra_compile_args=["-O2", "-std=c++17", "-Wno-unused-parameter"],
        )
    ],
    cmdclass={"build_ext": BuildExtension},
)
