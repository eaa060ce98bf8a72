"""The 'best' checkpoint: the headline metric decides, and when it ties (an exact-match metric
that stays 0 early in training) the lower validation loss does, also across a resume."""

from __future__ import annotations

from tiny_models import SORT, tiny_sorting, tiny_train

from inftyformer.training import Trainer, load_checkpoint


def _scripted(trainer: Trainer, losses: dict[int, tuple[float, float]]) -> None:
    """Validation returns (headline, loss) scripted by step."""
    name = trainer.task.headline().name

    def evaluate(split="valid", num_batches=None):
        value, loss = losses[trainer.step]
        return {name: value, "loss": loss}

    trainer.evaluate = evaluate


def test_ties_on_the_headline_go_to_the_lower_loss_and_survive_a_resume(tmp_path):
    quiet = lambda text: None  # noqa: E731
    cfg = tiny_train(tmp_path / "run", steps=3, eval_every=1, test_batches=0)
    trainer = Trainer(cfg, SORT, tiny_sorting(), echo=quiet)
    higher = trainer.task.headline().higher_is_better
    level = 0.0 if higher else 1.0
    _scripted(trainer, {1: (level, 3.0), 2: (level, 2.0), 3: (level, 2.5)})
    result = trainer.fit()
    assert result.best_step == 2
    assert load_checkpoint(tmp_path / "run" / "best").meta["step"] == 2

    more = tiny_train(tmp_path / "run", steps=5, eval_every=1, test_batches=0)
    resumed = Trainer(more, SORT, tiny_sorting(), resume=True, allow_changes=True, echo=quiet)
    assert resumed.best_loss == 2.0
    _scripted(resumed, {4: (level, 2.2), 5: (level, 1.5)})
    assert resumed.fit().best_step == 5
    # a better headline wins whatever the loss
    again = tiny_train(tmp_path / "again", steps=2, eval_every=1, test_batches=0)
    trainer = Trainer(again, SORT, tiny_sorting(), echo=quiet)
    _scripted(trainer, {1: (level, 1.0), 2: (0.5, 9.0)})  # 0.5 is better either way
    assert trainer.fit().best_step == 2
