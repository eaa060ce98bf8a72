"""Long-term memory for pretrained Hugging Face causal LMs (GPT-2 and Llama family).

    from transformers import AutoModelForCausalLM
    from inftyformer.hf import add_long_term_memory   # also registers the model with Auto*

    base = AutoModelForCausalLM.from_pretrained(path)
    model = add_long_term_memory(base, num_basis=512, widths=(0.005, 0.01), tau=0.5)
    out = model(input_ids, state=None, labels=labels)    # out.logits, out.loss, out.state
    out = model(next_ids, state=out.state)                # the memory state is carried explicitly

Needs the optional extra `inftyformer[hf]` (transformers >= 5); the rest of inftyformer works
without it. Modules: `adapters.py` (where the memory plugs into each architecture),
`config.py`, `model.py` (the model; one call `forward_pass.py`, its hooks `hooks.py`, its memory
between calls `memory.py`, its argument checks `validation.py`, `generation.py`, its weights'
start `init_weights.py`, one block's memory `layer_memory.py`, what a call returns `output.py`),
`segments.py` (the segment loop of a long input), `streaming.py` (long documents in segments),
`convert.py` (a GGUF file to a safetensors model directory).
"""

from __future__ import annotations

try:
    import transformers  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the environment
    raise ImportError(
        "inftyformer.hf needs the Hugging Face extra: pip install 'inftyformer[hf]'"
    ) from err

from .adapters import ADAPTERS, BlockAdapter, supported_architectures
from .config import InftyformerConfig
from .model import InftyformerForCausalLM, add_long_term_memory
from .output import InftyformerOutput
from .streaming import StreamOutput, stream_loss

__all__ = [
    "ADAPTERS",
    "BlockAdapter",
    "InftyformerConfig",
    "InftyformerForCausalLM",
    "InftyformerOutput",
    "StreamOutput",
    "add_long_term_memory",
    "convert_gguf",
    "smollm2_gguf_path",
    "stream_loss",
    "supported_architectures",
]


def __getattr__(name: str):
    # imported on first use, so that `python -m inftyformer.hf.convert` runs the module once
    if name in ("convert_gguf", "smollm2_gguf_path"):
        from . import convert

        return getattr(convert, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
