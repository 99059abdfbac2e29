"""Opening what the compiler generated, without a card: `spyre-inspect` (python -m spyre_inductor.inspect).

* catalog.py: the compiled kernels of a directory (an artifact cache or SPYRE_ARTIFACTS), and
  naming one (its name, a unique prefix, or its directory; close matches when none fits);
* cost.py: a kernel's cost from the timing model (simulated, roofline, efficiency, bound);
* svg.py: the scratchpad map of a plan as a picture;
* cli.py: the commands (list, show, plan).
"""

from .catalog import KernelArtifact, KernelNotFound, find_kernel, kernels
from .cost import Cost, cost_of

__all__ = ["Cost", "KernelArtifact", "KernelNotFound", "cost_of", "find_kernel", "kernels"]
