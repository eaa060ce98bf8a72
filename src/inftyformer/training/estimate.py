"""How long a run will take, said when it starts: the steps left × the time of its second step
in this session (the first runs without the memory and window a stream carries, so it is
quicker than the rest), plus its evaluations, on valid every `eval_every` steps and the test at
the end, counted in model calls by the task (`Task.eval_calls`). An evaluation call (one segment
of up to `batch_size` rows, forward only) is guessed at a third of a training step (forward and
backward, about twice the forward) until the first evaluation on valid measures it; the test's
estimate is then said again from the measurement."""

from __future__ import annotations

from dataclasses import dataclass

EVAL_CALL_GUESS = 1 / 3  # an evaluation call's time / a training step's, until measured
HINT_SECONDS = 600.0  # a run estimated longer than this is told how to make it shorter


def duration(seconds: float) -> str:
    """`seconds` for people: "40 s", "12 min", "3.4 h"."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def valid_evaluations(step: int, steps: int, eval_every: int) -> int:
    """Evaluations on valid after steps step+1 … steps: every `eval_every`-th, and the last."""
    count = steps // eval_every - step // eval_every
    return count + (steps % eval_every != 0 and steps > step)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class RunEstimate:
    """A run's remaining time from one timed step (see the module docstring)."""

    step: int  # the step just timed
    steps: int  # the run's last step
    step_seconds: float
    valid_evals: int  # evaluations on valid still to come
    valid_calls: int | None  # model calls per evaluation on valid (None: not counted)
    test_calls: int | None  # model calls of the end-of-run test (0: no test)
    call_seconds: float | None = None  # measured; None: guessed from the step

    @property
    def call(self) -> float:
        measured = self.call_seconds
        return measured if measured is not None else self.step_seconds * EVAL_CALL_GUESS

    @property
    def training_seconds(self) -> float:
        return (self.steps - self.step) * self.step_seconds

    @property
    def valid_seconds(self) -> float | None:
        return None if self.valid_calls is None else self.valid_evals * self.valid_calls * self.call

    @property
    def test_seconds(self) -> float | None:
        return None if self.test_calls is None else self.test_calls * self.call

    def total_seconds(self) -> float:
        return self.training_seconds + (self.valid_seconds or 0.0) + (self.test_seconds or 0.0)

    def start_lines(self) -> list[str]:
        """What a run says once its first step is timed."""
        left = self.steps - self.step
        text = (
            f"time estimate: step {self.step} took {self.step_seconds:.1f} s, so the "
            f"{left} steps left ≈ {duration(self.training_seconds)}"
        )
        if self.valid_seconds is None or self.test_seconds is None:
            lines = [
                text + f", plus {_count(self.valid_evals, 'evaluation')} on valid and the test"
            ]
        else:
            test = (
                f"the end-of-run test ({self.test_calls} calls) ≈ {duration(self.test_seconds)}"
                if self.test_calls
                else "no test"
            )
            lines = [
                text + f"; {_count(self.valid_evals, 'evaluation')} on valid ({self.valid_calls} "
                f"calls each) ≈ {duration(self.valid_seconds)}; {test}; about "
                f"{duration(self.total_seconds())} in all (an evaluation call guessed at a third "
                "of a step until the first one is measured)"
            ]
        if self.total_seconds() > HINT_SECONDS:
            lines.append(
                "  shorter: fewer --steps, a smaller --batch-size, --set test_batches=0 (no test "
                "at the end), or for text --set max_tokens=N (each evaluated document's first "
                "N tokens)"
            )
        return lines

    def measured_line(self, calls: int, seconds: float) -> str | None:
        """What a run says after its first evaluation on valid (`calls` model calls that took
        `seconds`): the end-of-run test's estimate from the measured call."""
        if not self.test_calls or calls < 1:
            return None
        call = seconds / calls
        return (
            f"time estimate: an evaluation call took {call:.2f} s (valid: {calls} calls in "
            f"{seconds:.0f} s), so the end-of-run test ({self.test_calls} calls) ≈ "
            f"{duration(self.test_calls * call)}"
        )


__all__ = ["EVAL_CALL_GUESS", "RunEstimate", "duration", "valid_evaluations"]
