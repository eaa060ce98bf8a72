"""The tiny configurations the tests share."""

from inftyformer.native.model_config import MODEL_TYPES, ModelConfig
from inftyformer.tasks import SortingConfig
from inftyformer.training import TrainConfig

__all__ = [
    "C",
    "MODEL_TYPES",
    "SORT",
    "V",
    "tiny",
    "tiny_sorting",
    "tiny_train",
    "torchrun_cli",
]

V = 13  # vocabulary
C = 8  # segment_len


def tiny(model_type: str = "xl", **overrides) -> ModelConfig:
    """d_model 32, 2 layers, segments and short-term memory of 8 (none for "transformer")."""
    base = dict(
        vocab_size=V,
        model_type=model_type,
        d_model=32,
        n_layers=2,
        n_heads=2,
        d_ff=64,
        dropout=0.0,
        segment_len=C,
        mem_len=0 if model_type == "transformer" else 8,
        compression_rate=2,
        compressed_len=6,
        num_basis=16,
        num_samples=16,
    )
    base.update(overrides)
    if base.get("squeeze") == "fill":  # its places are the K centres: it never resamples
        del base["num_samples"]
    return ModelConfig(**base)


# ---- the tiny sorting run the training tests train: 1 layer of 16, segments of 32, T = 96
SORT = SortingConfig(seq_len=96)


def tiny_sorting(model_type: str = "infty", **overrides) -> ModelConfig:
    settings = dict(
        vocab_size=22,
        d_model=16,
        n_layers=1,
        d_ff=32,
        dropout=0.1,
        segment_len=32,
        mem_len=0 if model_type == "transformer" else 32,
        num_basis=8,
        num_samples=16,
        compressed_len=8,
    )
    settings.update(overrides)
    return tiny(model_type, **settings)


def tiny_train(out_dir, **overrides) -> TrainConfig:
    settings = dict(
        steps=6,
        batch_size=4,
        warmup_steps=2,
        eval_every=3,
        eval_batches=1,
        test_batches=1,
        log_every=1,
        progress=False,
        tensorboard=False,
        threads=1,
        out_dir=str(out_dir),
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def torchrun_cli(*args: str) -> list[str]:
    """The command line of `inftyformer ARGS` under torchrun with two CPU processes."""
    import sys

    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node=2", "-m", "inftyformer.cli", *map(str, args)]  # fmt: skip
