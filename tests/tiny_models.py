"""The tiny model configuration the model tests share."""

from inftyformer.config import ModelConfig

MODEL_TYPES = ("transformer", "xl", "compressive", "infty")
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
    return ModelConfig(**base)
