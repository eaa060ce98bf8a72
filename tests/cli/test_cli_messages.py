"""What a new user reads when something is not right: a mistyped run directory, --resume with
nothing to resume, Ctrl-C, an unknown --set key, the label of their own text, whitespace output."""

import signal

import pytest
from test_cli_train import TINY
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.commands.generate import visible_text
from inftyformer.training.trainer import Trainer


def run(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def sorting_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("msg") / "runs" / "sorting-infty"
    code, output = run("train", "sorting", "-o", out, "--steps", 2, "--eval-every", 2, *TINY)
    assert code == 0, output
    return out


def test_a_mistyped_run_directory_is_named_as_missing(sorting_run):
    code, output = run("evaluate", sorting_run.parent / "sorting-infy")
    assert code == 2
    assert "sorting-infy does not exist (did you mean" in output
    assert str(sorting_run) in output and "manifest" not in output
    code, output = run("generate", sorting_run.parent / "nothing-like-it")
    assert code == 2 and "nothing-like-it does not exist: give a run directory" in output
    code, output = run("inspect", sorting_run.parent / "no" / "such")
    assert code == 2 and "does not exist either" in output


def test_an_empty_run_directory_holds_no_checkpoint(tmp_path):
    code, output = run("evaluate", tmp_path)
    assert code == 2 and f"{tmp_path} holds no checkpoint" in output and "manifest" not in output


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    code, output = run("train", "sorting", "--resume", "-o", tmp_path, *TINY)
    assert code == 2 and f"nothing to resume: {tmp_path} holds no checkpoint" in output
    code, output = run("train", "sorting", "--resume", "-o", tmp_path / "new", *TINY)
    assert code == 2 and "nothing to resume: " in output and "does not exist" in output
    assert "without --resume" in output


def test_unknown_setting_suggests_the_closest_names_and_lists_all_on_request():
    code, output = run("train", "sorting", "--set", "num_base=3")
    assert code == 2
    assert "unknown setting 'num_base' (did you mean num_basis" in output
    assert "--set help" in output and "warmup_steps" not in output  # not every name
    code, output = run("train", "sorting", "--set", "colour=blue")
    assert code == 2 and "did you mean" not in output and len(output.splitlines()) == 1
    code, output = run("train", "sorting", "--set", "help")
    assert code == 0
    assert "model:" in output and "num_basis" in output and "warmup_steps" in output
    assert "  task:\n    seq_len: int = 512\n        T: symbols before the separator" in output
    assert max(len(line) for line in output.splitlines()) <= 100


def test_evaluate_help_promises_chance_only_where_it_is_printed():
    output = " ".join(run("evaluate", "--help")[1].split())
    assert "accuracy beside chance for sorting and recall" in output
    assert "perplexity and bits per byte" in output


def _interrupt_at_step_2(monkeypatch, how):
    real = Trainer.train_step

    def step(self):
        if self.step == 2:
            if how == "signal":
                signal.raise_signal(signal.SIGINT)  # as if Ctrl-C was pressed: stop at the step end
            else:
                raise KeyboardInterrupt  # a second Ctrl-C: at once
        return real(self)

    monkeypatch.setattr(Trainer, "train_step", step)


@pytest.mark.parametrize("how", ["signal", "second"])
def test_ctrl_c_prints_one_line(tmp_path, monkeypatch, how):
    _interrupt_at_step_2(monkeypatch, how)
    code, output = run("train", "sorting", "-o", tmp_path, "--steps", 6, *TINY)
    assert code == 130
    said = ("training ", "time estimate: ")
    lines = [line for line in output.splitlines() if not line.startswith(said)]
    if how == "signal":  # the request is acknowledged at once, before the step ends
        assert lines.pop(0) == (
            "stopping: will stop after the current step and save a checkpoint (press Ctrl-C "
            "again to stop at once)"
        )
    assert len(lines) == 1, output
    step = 3 if how == "signal" else 2  # a stop request finishes the step it came in
    assert f"at step {step} after" in lines[0]
    assert "checkpoint saved, continue with --resume" in lines[0]


def test_whitespace_output_is_described():
    assert visible_text(" " * 200) == "(only whitespace: 200 spaces)"
    assert visible_text(" \n\n ") == "(only whitespace: 2 spaces, 2 newlines)"
    assert visible_text("") == "(no text: the tokens decode to nothing)"
    assert visible_text("a" + " " * 30 + "b") == "a[30 spaces]b"
    assert visible_text("3 1 2\nend") == "3 1 2\nend"  # ordinary text unchanged


def test_evaluation_shows_progress_to_a_person_waiting(sorting_run, monkeypatch):
    """A sorting evaluation takes minutes: on a terminal the batches show as they go; in a log a
    quick one adds nothing, a long one a line with the time left every half minute."""
    from inftyformer import _progress

    code, output = run("evaluate", sorting_run, "--batches", 2)
    assert code == 0 and "evaluating" not in output  # not a terminal, and quick: no lines
    monkeypatch.setattr(_progress, "TRANSIENT_SECONDS", 0.0)  # a long one: lines with the ETA
    code, output = run("evaluate", sorting_run, "--batches", 2)
    assert code == 0 and "evaluating test: 1/2 (50%)" in output and " left, " in output, output
    monkeypatch.setattr(_progress, "TRANSIENT_SECONDS", 30.0)
    monkeypatch.setattr(_progress, "_is_terminal", lambda stream: True)
    code, output = run("evaluate", sorting_run, "--batches", 2)
    assert code == 0 and "evaluating test:" in output, output
