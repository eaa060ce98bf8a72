"""The hybrid rows' model (experiments/book_perplexity.py): the retrieval default with the
∞-former's continuous memory of trained weights (experiments/train_hybrid_memory.py), and, when
those were trained with low-rank adapters on the base (`_lora.py`), the adapters hooked on the
base for the time of one cell (the base is shared with the other rows).

    hybrid        the memory's weights, its memory read
    hybrid-empty  the same weights with the memory empty: the adapters alone (an empty memory
                  reads exactly 0; without adapters this row is the retrieval it was trained
                  beside: `retrieval`, or the default with the run's `--set` settings)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

from _lora import lora_of


def trained_settings(weights: str | Path) -> dict:
    """The training run's settings, kept in the memory weights' metadata."""
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        return json.loads(f.metadata()["settings"])


def reader_settings(weights: str | Path) -> dict:
    """The retrieval settings the memory `weights` were trained beside, on the default preset
    (the training's `--set`; {} for the default itself)."""
    return dict(trained_settings(weights).get("retrieval", {}))


def adapters_file(weights: str | Path) -> Path | None:
    """The adapters trained with the memory `weights` (beside them), None when it had none."""
    if not trained_settings(weights).get("lora_rank"):
        return None
    return Path(weights).with_name("lora.safetensors")


def digests(weights: str | Path) -> dict[str, str]:
    """The weights a hybrid cell reads, by their digest (the memory's, the adapters')."""
    files = {"memory_weights": Path(weights), "lora_weights": adapters_file(weights)}
    return {k: hashlib.sha256(f.read_bytes()).hexdigest()[:16]
            for k, f in files.items() if f is not None}  # fmt: skip


@contextlib.contextmanager
def hybrid_model(base, weights: str | Path, memory: bool = True) -> Iterator:
    """The `RetrievalLM` of a hybrid row on `base` (`memory`: with the continuous memory, else
    with the memory empty); the adapters, if trained, taken off `base` again on leaving."""
    from safetensors.torch import load_file

    from inftyformer.retrieval.continuous import ContinuousConfig
    from inftyformer.retrieval.model import RetrievalLM

    settings = trained_settings(weights)
    on_top = reader_settings(weights)
    lora = lora_of(base, settings)
    try:
        if lora is not None:
            lora.load_state_dict(load_file(str(adapters_file(weights))))
        if memory:
            layers = settings["layers"]
            config = ContinuousConfig(layers=tuple(layers) if layers else None)
            model = RetrievalLM(base, preset="retrieval", memory=config, **on_top).eval()
            model.memory.load_state_dict(load_file(str(weights)))
        else:
            model = RetrievalLM(base, preset="retrieval", **on_top).eval()
        yield model
    finally:
        if lora is not None:
            lora.remove()
