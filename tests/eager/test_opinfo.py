"""PyTorch's OpInfo suite on the spyre device: eager on spyre against the CPU over the OpInfo
sample inputs, for every op we claim and every dtype we support (spyre_inductor/testing/eager_opinfo.py:
CLAIMS, and the one XFAIL list). A claimed op x dtype passes only if every checked sample, its
in-place variant and its out= form run entirely in spyre programs (SPYRE_STRICT=1) and match the CPU.
An XFAIL entry must still fail, and in the way it is listed (through the CPU fallback, or with
results that differ from the CPU's): one that passes, or fails otherwise, fails the test (strict).

Tiers (tests/conftest.py): fp32 and int64, first samples, by default; every other claimed
dtype, and up to SLOW_SAMPLES samples of each, are `slow`. `python -m spyre_inductor.eager.coverage`
prints the summary.
"""

import pytest
import torch

from spyre_inductor.testing import eager_opinfo as E

E.ensure_importable()

from torch.testing._internal.common_device_type import instantiate_device_type_tests, ops  # noqa: E402
from torch.testing._internal.common_utils import TestCase  # noqa: E402

_BY_NAME = E.opinfos()
_NAMES = {id(op): name for name, op in _BY_NAME.items()}
OPS = [_BY_NAME[name] for name in sorted(_BY_NAME)]


def test_an_xfail_holds_only_for_the_failure_it_lists():
    through_cpu = E.Outcome(spyre=1, cpu=2)
    wrong = E.Outcome(spyre=3, failures=["sample 0: Tensor-likes are not close!"], mismatches=1)
    broken = E.Outcome(spyre=2, failures=["sample 1: RuntimeError: boom"])
    fallback, mismatch = E.Xfail("listed for the CPU fallback"), E.Xfail("listed for its numbers", E.MISMATCH)
    assert fallback.fails_as_listed(through_cpu) and not fallback.fails_as_listed(wrong)
    assert mismatch.fails_as_listed(wrong) and not mismatch.fails_as_listed(through_cpu)
    assert not fallback.fails_as_listed(broken) and not mismatch.fails_as_listed(broken)
    both = E.Xfail("listed for both", (E.FALLBACK, E.MISMATCH))
    assert both.fails_as_listed(through_cpu) and both.fails_as_listed(wrong) and not both.fails_as_listed(broken)
    with pytest.raises(ValueError, match="kind must be"):
        E.Xfail("a typo", "mismatches")


def test_a_result_off_the_cpus_passes_only_as_close_to_the_exact_answer_as_the_cpu():
    exact = torch.tensor([1.0, -2.0, 0.5, float("nan")], dtype=torch.float64)
    cpu = torch.tensor([1.0 + 3e-5, -2.0, 0.5, float("nan")])  # the CPU's own rounding: 3e-5 off
    ours = torch.tensor([1.0 - 2e-5, -2.0, 0.5, float("nan")])  # 5e-5 from the CPU's: assert_close fails
    with pytest.raises(AssertionError):
        torch.testing.assert_close(ours, cpu, equal_nan=True)
    assert E.as_close_as_cpu(ours, cpu, exact)
    assert not E.as_close_as_cpu(torch.tensor([1.0 - 5e-5, -2.0, 0.5, float("nan")]), cpu, exact)  # further
    assert not E.as_close_as_cpu(torch.tensor([1.0, -2.0, 0.5, 0.0]), cpu, exact)  # a NaN lost
    assert not E.as_close_as_cpu(ours.half(), cpu, exact)  # in another dtype than the CPU's: no
    assert not E.as_close_as_cpu(ours[:3], cpu, exact)


def _grade(op, dtype, samples):
    name = _NAMES[id(op)]
    if dtype not in E.dtypes_of(op, name):
        pytest.skip(f"{name} is not claimed in {dtype}")
    outcome = E.check(op, dtype, samples)
    problems = outcome.failures + ([f"{outcome.cpu} run(s) needed the CPU fallback"] if outcome.cpu else [])
    xfail = E.expected_failure(name, dtype, samples)
    if xfail is not None:
        if outcome.passed:
            pytest.fail(f"{name} {dtype} passes now: remove it from eager_opinfo.XFAIL ({xfail.reason})")
        if not xfail.fails_as_listed(outcome):
            pytest.fail(f"{name} {dtype} is listed in eager_opinfo.XFAIL as a {xfail.kind} ({xfail.reason}), "
                        f"but fails otherwise: " + "; ".join(problems))
        pytest.xfail(xfail.reason)
    assert outcome.passed, f"{name} {dtype}: " + "; ".join(problems)
    assert outcome.spyre > 0


class TestEagerOpInfo(TestCase):
    @ops(OPS, allowed_dtypes=E.ALL)
    def test_eager_matches_cpu(self, device, dtype, op):
        _grade(op, dtype, E.FAST_SAMPLES)

    @ops(OPS, allowed_dtypes=E.ALL)
    def test_eager_matches_cpu_more_samples(self, device, dtype, op):
        _grade(op, dtype, E.SLOW_SAMPLES)


instantiate_device_type_tests(TestEagerOpInfo, globals(), only_for="privateuse1")
