"""torch.spyre.kernel_reports() as a user first reaches for it: right after a launch, with no
synchronize() of their own, and printed at the prompt."""

from __future__ import annotations

import torch


def test_reports_of_what_was_launched_are_there_without_a_synchronize():
    x = torch.randn(1000, device="spyre")
    torch.spyre.synchronize()
    torch.spyre.reset_kernel_reports()
    y = x * 2
    reports = torch.spyre.kernel_reports()
    assert [r.name for r in reports] and reports[-1].name.startswith("spyre_pw_mul")
    assert torch.equal(y.cpu(), x.cpu() * 2)


def test_a_report_prints_as_one_short_line():
    x = torch.randn(1000, device="spyre")
    torch.spyre.reset_kernel_reports()
    (x + 1).sum()
    reports = torch.spyre.kernel_reports()
    assert reports
    for r in reports:
        text = repr(r)
        assert text.startswith(f"Report({r.name!r}, ") and "\n" not in text and len(text) < 200
        assert "us simulated" in text and "efficiency" in text and "hardware" not in text.lower()
