"""TrainConfig validation, key=value overrides, the learning-rate schedule and parameter groups."""

import dataclasses
import math

import pytest
import torch

from inftyformer.native.model import decay_groups
from inftyformer.tasks import LMConfig
from inftyformer.training.config import (
    TrainConfig,
    parse_overrides,
    parse_value,
    split_assignment,
)
from inftyformer.training.trainer import lr_factor, param_groups


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(lr=-1e-3), "lr"),
        (dict(lr=0.0), "lr"),
        (dict(lr=float("nan")), "lr"),
        (dict(steps=0), "steps"),
        (dict(batch_size=6, grad_accum=4), "divisible"),
        (dict(device="tpu"), "device"),
        (dict(beta2=1.0), "beta"),
        (dict(min_lr_ratio=1.5), "min_lr_ratio"),
        (dict(seed=-1), "seed"),
        (dict(steps=2.5), "steps"),
        (dict(progress="yes"), "progress"),
        (dict(out_dir=""), "out_dir"),
    ],
)
def test_bad_values_are_refused_at_construction(kw, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TrainConfig(**kw)


def test_dict_round_trip():
    cfg = TrainConfig(steps=7, lr=3e-4, device="cuda:1")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="unknown TrainConfig keys: nope"):
        TrainConfig.from_dict({**cfg.to_dict(), "nope": 1})


def test_overrides_are_typed_and_unknown_keys_refused():
    got = parse_overrides(
        TrainConfig,
        {"steps": "1_000", "lr": "3e-4", "progress": "off", "task": "lm"},
        "train",
    )
    assert got == {"steps": 1000, "lr": 3e-4, "progress": False, "task": "lm"}
    data_dir = parse_overrides(LMConfig, {"data_dir": "none"}, "task")
    assert data_dir == {"data_dir": None}  # X | None fields read "none" as None
    unknown = r"unknown train setting .stepz. \(did you mean steps\?\); --set help"
    with pytest.raises(ValueError, match=unknown):
        parse_overrides(TrainConfig, {"stepz": "3"}, "train")
    with pytest.raises(ValueError, match="steps: expected an integer"):
        parse_overrides(TrainConfig, {"steps": "many"}, "train")
    with pytest.raises(ValueError, match="expected a boolean"):
        parse_overrides(TrainConfig, {"progress": "maybe"}, "train")
    cfg = dataclasses.replace(TrainConfig(), **parse_overrides(TrainConfig, {"lr": "2e-3"}, "t"))
    assert cfg.lr == 2e-3


def test_tuple_and_optional_values():
    assert parse_value("w", "0.01,0.05", tuple[float, ...]) == (0.01, 0.05)
    assert parse_value("p", "(1, 2)", tuple[int, int]) == (1, 2)
    assert parse_value("o", "none", int | None) is None
    assert parse_value("o", "4", int | None) == 4
    with pytest.raises(ValueError):
        split_assignment("no-equals-sign")
    assert split_assignment("a=b=c") == ("a", "b=c")


def test_warmup_then_cosine():
    cfg = TrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg) for s in range(cfg.steps)]
    assert factors[0] == pytest.approx(0.1) and factors[9] == pytest.approx(1.0)
    assert factors[10] == pytest.approx(1.0)
    assert factors[60] == pytest.approx(0.1 + 0.9 * 0.5)
    assert all(a >= b for a, b in zip(factors[10:], factors[11:], strict=False))
    assert factors[-1] == pytest.approx(0.1, abs=1e-3)
    no_warmup = TrainConfig(steps=5, warmup_steps=0, min_lr_ratio=0.0)
    assert lr_factor(0, no_warmup) == 1.0
    assert math.isclose(lr_factor(5, no_warmup), 0.0, abs_tol=1e-12)


def test_no_decay_for_biases_norms_and_embeddings():
    model = torch.nn.Sequential(
        torch.nn.Embedding(5, 4), torch.nn.LayerNorm(4), torch.nn.Linear(4, 3)
    )
    model.param_groups = lambda lr, wd: decay_groups(model, lr, wd)  # the model contract's
    groups = param_groups(model, 1e-3, 0.1)
    assert all(g["lr"] == g["base_lr"] == 1e-3 for g in groups)
    decay = [g for g in groups if g["weight_decay"] > 0]
    no_decay = [g for g in groups if g["weight_decay"] == 0]
    assert [p.shape for p in decay[0]["params"]] == [torch.Size([3, 4])]
    assert len(no_decay[0]["params"]) == 4  # embedding, norm weight+bias, linear bias
