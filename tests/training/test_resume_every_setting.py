"""Every setting a trained model may change (`model_kinds.changeable_settings`: resume with
--allow-changes, evaluation with other memory settings) is one a resumed run continues with:
for each model kind, each setting on its list is changed on a language-model run that carries
its memory from step to step, the run is resumed with the change, and it must take a step (or
the model's config refuses the value by name, for a setting the kind never takes). A change
the carried memory cannot hold (its shapes or the settings that give its numbers their
meaning) starts the streams' memory again, said and recorded in the run's history; the one a
run's data position depends on (segment_len) and a rate set or unset that changes the
optimiser's groups (density_lr) are refused before the run starts, by name."""

from __future__ import annotations

import shutil

import pytest
from tiny_models import tiny, tiny_train

from inftyformer.model_kinds import changeable_settings
from inftyformer.tasks import LMConfig
from inftyformer.training import CheckpointError, Trainer, load_checkpoint
from inftyformer.training.resume import MEMORY_BOUND, RESUME_FIXED

# the settings each memory takes its change from, and the change(s) tried for each setting
PLAIN = dict(num_basis=16, num_samples=16)
FILL = dict(num_basis=16, squeeze="fill", density="mixture", widths=(0.05, 0.2))
SALIENT = dict(FILL, keep_salient=1)
HEADS = dict(FILL, memory_read="heads")  # a pretrained model's heads read the fill memory
COMPRESSIVE = dict(model_type="compressive")  # a native kind with compressed slots
CHANGES: dict[str, list[tuple[dict, object]]] = {
    "segment_len": [(PLAIN, 4), (PLAIN, 16)],
    "mem_len": [(PLAIN, 4), (PLAIN, 16), (COMPRESSIVE, 4)],
    "compressed_len": [(PLAIN, 4), (COMPRESSIVE, 2), (COMPRESSIVE, 8)],
    "window": [(PLAIN, 0), (PLAIN, 4)],
    "num_samples": [(PLAIN, 32)],
    "tau": [(PLAIN, 0.6)],
    "squeeze": [(PLAIN, "by_length"), (FILL, "by_length")],
    "ridge_lambda": [(PLAIN, 0.7)],
    "sticky": [(PLAIN, True)],
    "sticky_bins": [(PLAIN, 64)],
    "edge_padding": [(PLAIN, False)],
    "sigma_0": [(PLAIN, 0.1)],
    "sharpness": [(FILL, 2.0)],
    "sink_edge": [(FILL, 0.1)],
    "token_mass": [(FILL, True), (HEADS, True)],
    "keep_first": [(FILL, 1)],
    "keep_last": [(FILL, 1)],
    "keep_salient": [(FILL, 1), (SALIENT, 0)],
    "salient_before": [(SALIENT, 2)],
    "kl_weight": [(PLAIN, 0.1)],
    "dropout": [(PLAIN, 0.1)],
    "attention_dropout": [(PLAIN, 0.1)],
    "memory_lr": [(PLAIN, 1e-3)],
    "density_lr": [(dict(PLAIN, density_lr=1e-3), 2e-3), (PLAIN, 1e-3)],
}
# what a native model's config refuses altogether (the salience of a pretrained model's logits)
NATIVE_NEVER = {"keep_salient", "salient_before"}


def quiet(text: str) -> None:
    return None


def write_corpus(root, words: str) -> str:
    for split, n in (("train", 3), ("valid", 1), ("test", 1)):
        (root / split).mkdir(parents=True)
        for i in range(n):
            text = " ".join(words.split()[i:] * 12)  # documents of a few hundred tokens
            (root / split / f"{i}.txt").write_text(text + "\n", encoding="utf-8")
    return str(root)


def resume_every_setting(tmp_path, task: LMConfig, make_model, kind_never=frozenset()):
    """Train each base memory 2 of 3 steps, then resume a copy with each change: returns
    {(setting, value): "step" | "refused: ..."} and the histories written."""
    trained = {}
    outcomes, histories = {}, {}
    listed = changeable_settings(make_model(**PLAIN))
    assert not set(listed) - set(CHANGES), "a change to try for each setting on the list"
    for setting, changes in CHANGES.items():
        if setting not in listed:
            continue
        for settings, value in changes:
            key = tuple(sorted(settings.items()))
            try:
                base = make_model(**settings)
            except ValueError as err:  # a memory this kind never has
                outcomes[setting, value] = f"refused: {err}"
                continue
            if key not in trained:
                out = tmp_path / f"base-{len(trained)}"
                run = tiny_train(out, task="lm", steps=3, halt_after=2, batch_size=2,
                                 eval_every=3, test_batches=0)  # fmt: skip
                Trainer(run, task, base, echo=quiet).fit()
                trained[key] = out
            copy = tmp_path / f"{setting}-{value}-{len(outcomes)}"
            shutil.copytree(trained[key], copy)
            run = tiny_train(copy, task="lm", steps=3, batch_size=2, eval_every=3,
                             test_batches=0)  # fmt: skip
            try:
                changed = make_model(**{**settings, setting: value})
            except ValueError as err:
                assert setting in str(err), err  # refused by the config, by name
                outcomes[setting, value] = f"refused: {err}"
                continue
            try:
                trainer = Trainer(run, task, changed, resume=True, allow_changes=True, echo=quiet)
            except CheckpointError as err:  # refused before the run starts
                outcomes[setting, value] = f"refused: {err}"
                continue
            try:
                result = trainer.fit()
            except Exception as err:  # noqa: BLE001 - reported with the setting below
                outcomes[setting, value] = f"failed: {type(err).__name__}: {err}"[:300]
                continue
            assert result.step == 3 and result.finished
            outcomes[setting, value] = "step"
            histories[setting, value] = load_checkpoint(copy / "last").meta["history"]
    return outcomes, histories


def check(outcomes, histories, listed, never):
    """Every listed setting was tried. A setting this kind never takes was refused by its
    config, one a resume cannot take (`RESUME_FIXED`) by the resume, naming it; every other
    setting took a step with at least one change, and any change that did not was refused
    before the run started, naming the setting. Each step's change is in the history, with
    the memory started again where the carried one was bound to the old value."""
    assert {setting for setting, _ in outcomes} == set(listed)
    failed = {k: v for k, v in outcomes.items() if v.startswith("failed")}
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())
    for (setting, value), outcome in outcomes.items():
        if outcome.startswith("refused"):  # by name (a kind's never: by its config)
            assert setting in outcome or setting in never, (setting, value, outcome)
            continue
        assert setting not in (*never, *RESUME_FIXED), (setting, value, outcome)
        entry = histories[setting, value][-1]
        assert f"model.{setting}" in entry["changes"], (setting, entry)
        assert ("memory" in entry) == (setting in MEMORY_BOUND), (setting, entry)
    stepped = {setting for (setting, _), outcome in outcomes.items() if outcome == "step"}
    assert stepped == set(listed) - set(never) - set(RESUME_FIXED)


def test_a_native_run_resumes_with_every_changeable_setting(tmp_path):
    task = LMConfig(data_dir=write_corpus(tmp_path / "corpus", WORDS), tokenizer="bytes")

    def model(**settings):
        kind = settings.pop("model_type", "infty")
        return tiny(kind, **{"vocab_size": 257, "segment_len": 8, "mem_len": 8, **settings})

    outcomes, histories = resume_every_setting(tmp_path, task, model)
    check(outcomes, histories, changeable_settings(model(**PLAIN)), NATIVE_NEVER)


def test_a_pretrained_run_resumes_with_every_changeable_setting(tmp_path):
    pytest.importorskip("transformers")
    from tiny_pretrained import write_tiny_model

    from inftyformer.model_kinds import PretrainedMemoryConfig

    base = write_tiny_model(tmp_path / "base", "llama", corpus=[WORDS] * 20, max_positions=64)
    task = LMConfig(data_dir=write_corpus(tmp_path / "corpus", WORDS), tokenizer=str(base))

    def model(**settings):
        fixed = {"base_model": str(base), "freeze_base": True, "segment_len": 8, "window": 8}
        return PretrainedMemoryConfig(**{**fixed, **settings})

    outcomes, histories = resume_every_setting(tmp_path, task, model)
    check(outcomes, histories, changeable_settings(model(**PLAIN)), set())


WORDS = (
    "the memory of a long book said the signal and a reader kept the key in the garden while "
    "the clocks were striking thirteen on a bright cold day in april"
)
