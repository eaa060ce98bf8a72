"""The run's time estimate: its arithmetic by hand, and that a run says it after its first step."""

from __future__ import annotations

import pytest

from inftyformer.training.estimate import RunEstimate, duration, valid_evaluations


def test_durations_read_as_people_say_them():
    assert [duration(s) for s in (40, 89.4, 720, 5399, 7200, 72000)] == [
        "40 s", "89 s", "12 min", "90 min", "2.0 h", "20.0 h",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("step", "steps", "every", "expected"),
    [(0, 600, 100, 6), (0, 650, 100, 7), (99, 600, 100, 6), (100, 600, 100, 5), (599, 600, 100, 1),
     (600, 600, 100, 0), (0, 3, 100, 1)],
)  # fmt: skip
def test_valid_evaluations_are_every_eval_every_steps_and_the_last(step, steps, every, expected):
    assert valid_evaluations(step, steps, every) == expected


def test_the_issue_s_run_by_hand():
    """600 steps of 120 s, 6 evaluations of 4 calls and a test of 451 calls (the pretrained run
    of issue 41): calls guessed at 40 s until measured; 71,880 + 960 + 18,040 s = 25.2 h."""
    e = RunEstimate(step=1, steps=600, step_seconds=120.0, valid_evals=6, valid_calls=4,
                    test_calls=451)  # fmt: skip
    assert e.training_seconds == 599 * 120.0
    assert e.valid_seconds == pytest.approx(6 * 4 * 40.0)
    assert e.test_seconds == pytest.approx(451 * 40.0)
    first, hint = e.start_lines()
    assert "step 1 took 120.0 s, so the 599 steps left ≈ 20.0 h" in first
    assert "6 evaluations on valid (4 calls each) ≈ 16 min" in first
    assert "the end-of-run test (451 calls) ≈ 5.0 h" in first and "about 25.2 h in all" in first
    assert "--steps" in hint and "max_tokens" in hint
    measured = e.measured_line(4, 20.0)  # 5 s a call, measured
    assert measured.endswith("so the end-of-run test (451 calls) ≈ 38 min")


def test_short_runs_get_no_hint_and_uncounted_evaluations_are_named():
    e = RunEstimate(step=1, steps=10, step_seconds=0.5, valid_evals=1, valid_calls=None,
                    test_calls=None)  # fmt: skip
    assert e.start_lines() == [
        "time estimate: step 1 took 0.5 s, so the 9 steps left ≈ 4 s, plus 1 evaluation on "
        "valid and the test"
    ]
    assert e.measured_line(3, 1.0) is None
    no_test = RunEstimate(1, 10, 0.5, 1, 2, 0)
    assert "no test" in no_test.start_lines()[0] and no_test.measured_line(2, 1.0) is None
