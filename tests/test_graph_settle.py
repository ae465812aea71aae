"""SettledConstants: a graph step whose host constants moved steps eagerly until the new ones have held for
``settle`` steps in a row, then captures them; constants that come back replay at once."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from sparsity_lab.graph_settle import CAPTURE, EAGER, REPLAY, SettledConstants
from sparsity_lab.graph_step import CudaGraphStep


def run(settle, seen, held="A"):
    """The decisions for the constants ``seen`` step by step, the graph capturing at each CAPTURE."""
    policy, out = SettledConstants(settle), []
    for now in seen:
        action = policy.decide(held, now)
        if action == CAPTURE:
            held = now
        out.append(action)
    return out, policy


def test_new_constants_wait_settle_steps_then_capture():
    out, policy = run(2, "AABBBBA")
    assert out == [REPLAY, REPLAY, EAGER, EAGER, CAPTURE, REPLAY, EAGER]
    assert policy.waited == 3


def test_settle_zero_captures_at_the_first_step_with_new_constants():
    out, policy = run(0, "ABBCA")
    assert out == [REPLAY, CAPTURE, REPLAY, CAPTURE, CAPTURE] and policy.waited == 0


def test_constants_that_come_back_replay_and_a_change_restarts_the_wait():
    out, _ = run(2, "ABABBCCC")
    assert out == [REPLAY, EAGER, REPLAY, EAGER, EAGER, EAGER, EAGER, CAPTURE]


def reference(settle, seen, held="A"):
    """Capture at step t iff the constants differ from the graph's and equal those of the settle steps before."""
    out = []
    for t, now in enumerate(seen):
        if now == held:
            out.append(REPLAY)
        elif t >= settle and all(seen[t - k] == now for k in range(1, settle + 1)):
            out.append(CAPTURE)
            held = now
        else:
            out.append(EAGER)
    return out


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 5), st.lists(st.sampled_from("ABC"), max_size=40))
def test_decisions_follow_the_rule_on_any_sequence(settle, seen):
    out, policy = run(settle, seen)
    assert out == reference(settle, seen)
    assert policy.waited == out.count(EAGER)
    # never more than `settle` eager steps in a row for one set of constants
    streak = 0
    for now, before, action in zip(seen, [None] + seen[:-1], out):
        streak = streak + 1 if action == EAGER and now == before else int(action == EAGER)
        assert streak <= settle


@pytest.mark.parametrize("bad", [-1, 1.5, True, "4"])
def test_bad_settle_values_are_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match="scale_settle_steps must be an int >= 0"):
        SettledConstants(bad)
    with pytest.raises(ValueError, match="scale_settle_steps must be an int >= 0"):
        CudaGraphStep(nn.Linear(4, 4), lambda m: None, scale_settle_steps=bad)
