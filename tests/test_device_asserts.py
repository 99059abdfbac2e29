"""Device-side asserts (``torch._assert_async``, one_hot's range checks in a compiled graph) on
spyre: the condition is computed on the card, the check runs in stream order without the host
waiting, and a false condition stops the stream with the assert's message at the next
synchronize, sticky until ``torch.spyre.clear_errors()`` as every failed operation is.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from spyre_inductor.device.fallback import strict_mode
from spyre_runtime.queue.tickets import StreamError

SPYRE = "spyre"


@pytest.fixture(autouse=True)
def _clean():
    torch._dynamo.reset()
    torch.spyre.clear_errors()
    yield
    torch.spyre.clear_errors()


def test_a_true_assert_passes_and_a_false_one_fails_the_stream_at_synchronize():
    with strict_mode(True):
        torch._assert_async(torch.tensor(2.0).to(SPYRE))
        torch.spyre.synchronize()
        torch._assert_async(torch.tensor(0.0).to(SPYRE), "the ids must be in range")  # returns at once
        with pytest.raises(StreamError, match="the ids must be in range"):
            torch.spyre.synchronize()
        torch.spyre.clear_errors()
        assert (torch.ones(3).to(SPYRE) * 2).cpu().tolist() == [2.0, 2.0, 2.0]  # usable again


def test_an_assert_of_several_elements_is_refused_at_the_call_as_the_cpu_refuses_it():
    with pytest.raises(RuntimeError, match="more than one value is ambiguous"):
        torch._assert_async(torch.ones(2).to(SPYRE))


def test_compiled_one_hot_runs_on_the_card_under_strict():
    """one_hot's decomposition asserts its class range (tests/compiler/test_topk_sort.py: eager)."""
    ids = torch.tensor([[0, 3, 1], [2, 2, 0]])
    torch.spyre.reset_fallback_reports()
    with strict_mode(True):
        out = torch.compile(lambda i: F.one_hot(i, 4))(ids.to(SPYRE))
        assert torch.equal(out.cpu(), F.one_hot(ids, 4))
    assert torch.spyre.fallback_reports() == []


@pytest.mark.parametrize("ids, message", [([0, 5, 1], "smaller than num_classes"), ([0, -1, 1], "non-negative")])
def test_compiled_one_hot_of_an_id_out_of_range_fails_with_one_hots_message(ids, message):
    with strict_mode(True):
        torch.compile(lambda i: F.one_hot(i, 4))(torch.tensor(ids).to(SPYRE))
        with pytest.raises(StreamError, match=message):
            torch.spyre.synchronize()


def test_the_check_waits_for_the_condition_computed_on_another_stream():
    x = torch.zeros(1 << 16).to(SPYRE)
    side = torch.spyre.Stream()
    with strict_mode(True):
        with torch.spyre.stream(side):
            cond = (x > 5).all()  # false, written by the side stream
        torch._assert_async(cond, "read after the side stream wrote it")  # checked on the current stream
        with pytest.raises(StreamError, match="read after the side stream wrote it"):
            torch.spyre.synchronize()


def test_an_empty_message_fails_in_the_cpus_words():
    torch._assert_async(torch.tensor(0.0).to(SPYRE), "")
    with pytest.raises(StreamError, match="Assertion is failed"):
        torch.spyre.synchronize()


def test_the_functional_form_checks_and_hands_back_a_new_token():
    token = torch.ones(1).to(SPYRE)
    out = torch.ops.aten._functional_assert_async.msg(torch.tensor(1).to(SPYRE), "fine", token)
    assert out.device == token.device and out.data_ptr() != token.data_ptr()
    torch.ops.aten._functional_assert_async.msg(torch.tensor(0).to(SPYRE), "the functional form", token)
    with pytest.raises(StreamError, match="the functional form"):
        torch.spyre.synchronize()
