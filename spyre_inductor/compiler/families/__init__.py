"""The kernel families, each a package that registers one core.family.Family when imported.

Importing this package registers every family in dispatch order (the first family that claims
a kernel plans it): attention, sort (rows through a sorting network), the grouped matmul of
mixture-of-experts routing (experts), gathers and scatters inside reductions, conv2d (an implicit
GEMM), matmul, reductions and scans, and pointwise last (it claims whatever is left).
"""

from .attention import family as _attention  # noqa: F401 - registers
from .sort import family as _sort  # noqa: F401
from .experts import family as _experts  # noqa: F401
from .indirect import family as _indirect  # noqa: F401
from .convolution import family as _convolution  # noqa: F401
from .matmul import family as _matmul  # noqa: F401
from .reduction import family as _reduction  # noqa: F401
from .pointwise import family as _pointwise  # noqa: F401
