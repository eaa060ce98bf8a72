"""The task contract: a task written here, in one module, trains through the trainer and the
command line with no change anywhere else (its registration is the only other line)."""

from dataclasses import dataclass

import pytest
import torch
from tiny_models import tiny, tiny_train
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.tasks import (
    TASKS,
    Evaluation,
    Metric,
    Shard,
    StepOutput,
    Task,
    TaskConfig,
    get_task,
    register_task,
)
from inftyformer.tasks.base import add_sums, scored_sums
from inftyformer.training import Trainer, evaluate_run, load_checkpoint

VOCAB = 8


@dataclass(frozen=True)
class EchoConfig(TaskConfig):
    length: int = 8  # tokens per example

    def __post_init__(self) -> None:
        if not isinstance(self.length, int) or self.length < 2:
            raise ValueError(f"length must be an int >= 2, got {self.length!r}")


class EchoTask(Task):
    """Predict the token before the current one (a one-step recall)."""

    summary = "repeat the previous token"
    Config = EchoConfig
    metrics = (Metric("accuracy", ".3f", higher_is_better=True), Metric("loss"))
    progress_metrics = ("accuracy",)

    @classmethod
    def model_overrides(cls, config):
        return {"vocab_size": VOCAB, "segment_len": config.length}

    def _examples(self, index: int, split: str):
        seed = self.context.seed * 1_000 + index + (0 if split == "train" else 500)
        x = torch.randint(0, VOCAB, (self.context.batch_size, self.config.length),
                          generator=torch.Generator().manual_seed(seed))  # fmt: skip
        y = torch.full_like(x, -100)
        y[:, 1:] = x[:, :-1]
        return x, y

    def batch(self, step):
        return self._examples(step, "train")

    def loss(self, model, batch, rows, part):
        x, y = batch[0][rows], batch[1][rows]
        out = model(x, targets=y)
        return StepOutput(out.loss, {**scored_sums(out.logits, y), "tokens": float(x.numel())})

    def train_metrics(self, sums):
        return {"accuracy": sums["correct"] / sums["count"]}

    @torch.no_grad()
    def evaluate(self, model, split, num_batches, shard: Shard):
        total: dict[str, float] = {}
        for index in range(num_batches or 1):
            x, y = self._examples(index, split)
            rows = shard.rows(x.shape[0])
            add_sums(total, scored_sums(model(x[rows]).logits, y[rows]))
        return Evaluation(total)

    def eval_metrics(self, sums):
        return {"accuracy": sums["correct"] / sums["count"], "loss": sums["nll"] / sums["count"]}


@pytest.fixture
def echo_task():
    register_task("echo")(EchoTask)
    yield EchoTask
    TASKS.pop("echo")


def test_a_task_in_one_module_trains_and_evaluates(echo_task, tmp_path):
    config = EchoConfig(length=8)
    model = tiny("xl", **EchoTask.model_overrides(config))
    run = tiny_train(tmp_path, task="echo", steps=60, batch_size=8, eval_every=20, lr=1e-2)
    result = Trainer(run, config, model, echo=lambda s: None).fit()
    assert result.finished and get_task("echo") is EchoTask
    # the one-step recall is learned (chance is 1/8)
    assert result.test["accuracy"] > 0.5
    metrics, _, task = evaluate_run(tmp_path, "test", 1)
    assert metrics["accuracy"] == result.test["accuracy"] and isinstance(task, EchoTask)
    assert load_checkpoint(tmp_path / "last").meta["task_config"] == {"length": 8}


def test_the_command_line_finds_a_registered_task(echo_task, tmp_path):
    runner = CliRunner()
    args = ["train", "echo", "--set", "length=8", "--set", "d_model=16", "--set", "n_layers=1",
            "--set", "mem_len=8", "--steps", "2", "--batch-size", "2", "--no-progress",
            "--set", "tensorboard=false", "--out-dir", str(tmp_path)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.output
    result = runner.invoke(app, ["evaluate", str(tmp_path), "--batches", "1"])
    assert result.exit_code == 0 and "test accuracy" in result.output, result.output
    # a task option it has no setting for is a clear error, not silently ignored
    result = runner.invoke(app, [*args[:2], "--seq-len", "64", "--out-dir", str(tmp_path / "x")])
    assert result.exit_code != 0 and "--seq-len is not a setting of task 'echo'" in result.output
