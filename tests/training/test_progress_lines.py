"""Progress bars do not flood a log: when the output is not a terminal, one plain line every N
steps (about 20 in all) instead of a stream of carriage-return redraws."""

from __future__ import annotations

import io

from tiny_models import SORT, tiny_sorting, tiny_train
from tqdm import tqdm

from inftyformer._progress import LineProgress, progress
from inftyformer.training import Trainer


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_file_gets_whole_lines_every_n_updates():
    out = io.StringIO()
    bar = progress(total=200, desc="train", file=out)
    assert isinstance(bar, LineProgress)
    for _ in range(200):
        bar.update(1)
        bar.set_postfix({"loss": "1.000"})
    bar.close()
    text = out.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert len(lines) == 20 and lines[-1].startswith("train: 200/200 (100%)")
    assert lines[0].startswith("train: 10/200 (5%)") and "loss=1.000" in lines[-1]


def test_iteration_and_explicit_intervals():
    out = io.StringIO()
    assert list(progress(range(7), desc="eval", every=3, file=out)) == list(range(7))
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["3/7", "6/7", "7/7"]


def test_a_terminal_gets_tqdm_and_disabled_gets_nothing():
    assert isinstance(progress(total=3, file=Terminal()), tqdm)
    out = io.StringIO()
    bar = progress(total=3, enabled=False, file=out)
    bar.update(3)
    bar.close()
    assert out.getvalue() == ""


def test_training_into_a_log_writes_a_few_lines(tmp_path, capsys):
    cfg = tiny_train(tmp_path, steps=40, eval_every=40, progress=True)
    Trainer(cfg, SORT, tiny_sorting(), echo=lambda s: None).fit()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("sorting/infty: ")]
    assert len(lines) == 20 and "40/40 (100%)" in lines[-1]
    assert len(err.splitlines()) == 20  # the quick evaluations inside add nothing


def test_a_transient_bar_writes_to_a_log_only_when_it_takes_long(monkeypatch):
    import inftyformer._progress as module

    now = [0.0]
    monkeypatch.setattr(module.time, "perf_counter", lambda: now[0])
    out = io.StringIO()
    bar = progress(total=8, desc="evaluating test", leave=False, file=out)
    for _ in range(8):  # 8 batches of 10 s: a line at most every 30 s, none at the end
        now[0] += 10.0
        bar.update(1)
    bar.close()
    assert [line.split()[2] for line in out.getvalue().splitlines()] == ["3/8", "6/8"]


def test_a_terminal_without_a_size_still_shows_the_bar(monkeypatch):
    """A pty nobody sized (`script`, some CI runners) reports 0 columns; tqdm draws nothing at
    that width, so the bar takes a fixed width instead."""
    import os
    import pty
    import select

    monkeypatch.delenv("COLUMNS", raising=False)
    master, slave = pty.openpty()
    with os.fdopen(slave, "w") as terminal:
        assert os.get_terminal_size(terminal.fileno()).columns == 0
        bar = progress(total=5, desc="train", file=terminal, dynamic_ncols=True, mininterval=0)
        for _ in range(5):
            bar.update(1)
        bar.close()
        terminal.flush()
        out = b""
        while select.select([master], [], [], 0.2)[0]:
            out += os.read(master, 65536)
    os.close(master)
    frames = out.decode().replace("\r\n", "\r").split("\r")
    drawn = [f for f in frames if f.startswith("train:")]
    assert any("3/5" in f for f in drawn) and "5/5" in drawn[-1]
    assert max(len(f) for f in drawn) == 80


def test_slow_steps_are_shown_as_seconds_per_step(monkeypatch):
    import inftyformer._progress as module

    clock = iter([0.0, 281.0, 600.0])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    bar = LineProgress(total=4, desc="lm", every=1, file=out)
    bar.update(1)  # one step in 281 s
    assert "281 s/it" in out.getvalue() and "it/s" not in out.getvalue()
    bar.update(3)  # four steps in 600 s: still slower than one a second
    assert out.getvalue().splitlines()[-1].endswith("150 s/it")


def test_a_log_line_says_the_time_left_at_the_rate_so_far(monkeypatch):
    import inftyformer._progress as module

    clock = iter([0.0, 281.0, 600.0])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    bar = LineProgress(total=4, desc="lm", every=1, file=out)
    bar.update(1)  # 3 steps left at 281 s each: 843 s
    assert out.getvalue() == "lm: 1/4 (25%) 04:41 elapsed, 14:03 left, 281 s/it\n"
    bar.update(3)  # done: no time left to say
    assert "left" not in out.getvalue().splitlines()[-1]
