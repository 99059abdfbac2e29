"""A stand-in for the ``expecttest`` package, used only where it is not installed.

torch.testing._internal.common_utils (which op_db and instantiate_device_type_tests
import) subclasses ``expecttest.TestCase`` for its inline-expectation assertions;
the OpInfo tests here use none of them. pyproject.toml lists the real package
(``expecttest==0.3.0``) among the test dependencies; spyre_inductor/testing/eager_opinfo.py puts
this directory on sys.path only when ``import expecttest`` fails.
"""

import unittest


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, *args, **kwargs):  # noqa: N802 - expecttest's name
        raise NotImplementedError("the expecttest stand-in has no inline expectations; install expecttest")
