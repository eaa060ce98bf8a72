"""The model contract and the model kinds, in one place.

    kind          settings                    model
    "native"      `ModelConfig`               `MemoryLM`: the four model types on one backbone
    "pretrained"  `PretrainedMemoryConfig`    a pretrained Hugging Face causal LM (GPT-2, Llama
                                              family) with the ∞-former's long-term memory in
                                              every block (`inftyformer.hf`, extra [hf])

Every kind implements `LanguageModel` (below), and the tasks, the trainer and the command line
call nothing else; a new kind is a config class and a model class, registered with
`register_model_kind`.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ._checks import check_memory_layers, check_positive_int, check_range
from .config import MEMORY_SETTINGS, ModelConfig
from .core.config import (
    CHANGEABLE_SETTINGS,
    GPT2_LONG_TERM,
    LongTermConfig,
    WithLongTerm,
    check_memory_positions,
    check_memory_read,
    takes_long_term_settings,
)
from .model import LMOutput
from .state import MemoryState


@takes_long_term_settings
@dataclass(frozen=True)
class PretrainedMemoryConfig(WithLongTerm):
    """A pretrained causal LM plus long-term memory (paper §4.2, GPT-2; `docs/hf.md`). Memory
    defaults are the paper's GPT-2 settings (`GPT2_LONG_TERM`; nested as `long_term`, also by
    their own names: `WithLongTerm`); the learning rates are its split: the memory at
    `memory_lr` without weight decay, the base at the run's `lr` (paper: 5e-5)."""

    base_model: str  # directory of a Hugging Face causal LM (config.json, weights, tokenizer)
    memory: bool = True  # False: the base alone, for comparison (attends within its segment)
    freeze_base: bool = False  # train the memory only (an adapter on a frozen model)
    memory_lr: float = 2.5e-4
    # the density heads w_μ, w_σ (None: memory_lr): at the paper's rate they barely move in a
    # short run (Adam moves a weight by about the learning rate per step), so reads stay flat
    density_lr: float | None = None
    segment_len: int = 256  # L: tokens per call when a document is streamed
    # W: previous tokens each call recomputes as context (None: one segment, as far as the
    # base's positions allow; 0: each segment attends within itself; `docs/hf.md`)
    window: int | None = None
    # N, widths, λ, τ, M, … (num_heads None: the base's heads; a read narrower than the basis
    # needs min_sigma_sq 1e-6); its dim is the base's hidden size (`inftyformer.hf.config`)
    long_term: LongTermConfig = GPT2_LONG_TERM
    # "added" (the paper's read, added to the attention output) or "heads" (the base's own heads
    # read the memory, merged by attention mass: `inftyformer.hf.head_read`)
    memory_read: str = "added"
    # heads read, rotary bases: "window" (every place just beyond the window), "places" (each
    # at its own stream position, squeeze="fill") or "ranks" (each at its rank among them)
    memory_positions: str = "window"
    memory_layers: tuple[int, ...] | None = None  # the blocks with a memory; None: every block
    vocab_size: int = 0  # read from the base's config.json

    def __post_init__(self) -> None:
        if not isinstance(self.base_model, str) or not self.base_model:
            raise ValueError(f"base_model must be a directory path, got {self.base_model!r}")
        config = Path(self.base_model).expanduser() / "config.json"
        if not config.is_file():
            raise FileNotFoundError(
                f"base_model {self.base_model} is not a Hugging Face model directory (no "
                "config.json); convert a GGUF file with `inftyformer convert-gguf`"
            )
        for name in ("memory", "freeze_base"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be a bool, got {getattr(self, name)!r}")
        self._check_long_term()
        check_range("memory_lr", self.memory_lr, 0.0, low_open=True)
        if self.density_lr is not None:
            check_range("density_lr", self.density_lr, 0.0, low_open=True)
        check_positive_int("segment_len", self.segment_len)
        if self.window is not None:
            check_positive_int("window", self.window, minimum=0)
        check_memory_read(self.memory_read, self.long_term.density)
        check_memory_positions(self.memory_positions, self.memory_read, self.long_term.squeeze)
        data = json.loads(config.read_text(encoding="utf-8"))
        data = data.get("text_config", data)  # a saved memory model nests the base's
        if self.memory_layers is not None:
            blocks = data.get("num_hidden_layers", data.get("n_layer"))
            layers = check_memory_layers(self.memory_layers, blocks)
            object.__setattr__(self, "memory_layers", tuple(layers))
        if not self.vocab_size:
            object.__setattr__(self, "vocab_size", int(data["vocab_size"]))

    @property
    def model_type(self) -> str:
        return "infty" if self.memory else "transformer"  # the memory it adds, or none

    def describe(self) -> str:
        return f"{Path(self.base_model).name} + {'long-term' if self.memory else 'no'} memory"

    def frozen_base(self) -> tuple[str, str] | None:
        """(directory, state-dict prefix) of the base when it is frozen: a checkpoint then
        refers to it instead of holding it (`inftyformer.base_weights`); None when it trains."""
        if self.freeze_base and self.memory:
            return self.base_model, "lm.base."
        return None

    def adapter_settings(self) -> dict[str, Any]:
        """The `inftyformer.hf.add_long_term_memory` settings."""
        skip = {"base_model", "memory", "freeze_base", "memory_lr", "density_lr", "vocab_size"}
        own = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        del own["long_term"]
        return {**own, **{name: getattr(self.long_term, name) for name in self.long_term_names()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PretrainedMemoryConfig:
        """A saved config (`to_dict`, flat; the memory's settings may be nested)."""
        # configs saved before the density setting existed read the scores as the paper does,
        # before the window existed each segment attended within itself
        return cls._from_saved(data, {"density": "paper", "window": 0})

    def with_memory_settings(self, overrides: dict[str, Any] | None = None) -> Any:
        """Other memory settings for evaluation (:data:`PRETRAINED_MEMORY_SETTINGS`); the
        fields that shape the weights or what trains stay."""
        if not overrides:
            return self
        bad = sorted(set(overrides) - set(PRETRAINED_MEMORY_SETTINGS))
        if bad:
            raise ValueError(
                f"cannot change {', '.join(bad)} of a trained pretrained model; allowed: "
                f"{', '.join(PRETRAINED_MEMORY_SETTINGS)}"
            )
        return self.replace(**overrides)


# what a trained pretrained model may change, like ModelConfig's MEMORY_SETTINGS: not the base,
# N, the widths or the gate (they shape weights), nor whether the memory or the base trains
PRETRAINED_MEMORY_SETTINGS = (
    "segment_len",
    "window",
    *CHANGEABLE_SETTINGS,  # the long-term memory's
    "memory_lr",
    "density_lr",
)


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: its settings (`config`) and its model class, named by import path and
    imported when the first model is built, so that a kind whose module builds on this one (the
    pretrained adapter in `inftyformer.hf`) or needs an extra is not imported with it."""

    name: str
    config: type
    model: str  # "module:Class"
    changeable: tuple[str, ...]  # settings a trained model may change (resume, evaluation)
    extra: str | None = None  # the pip extra the model class needs
    # config → (directory, state-dict prefix) of a frozen pretrained base that checkpoints refer
    # to instead of holding (`inftyformer.base_weights`), or None; None here: they hold it all
    frozen_base: Callable[[Any], tuple[str, str] | None] | None = None

    def model_class(self) -> type[nn.Module]:
        module, _, attr = self.model.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as err:
            if self.extra is None:
                raise
            raise ImportError(
                f"a {self.name} model needs the [{self.extra}] extra "
                f"(pip install -e '.[{self.extra}]'): {err}"
            ) from None


MODEL_KINDS: dict[str, ModelKind] = {}


def register_model_kind(kind: ModelKind) -> ModelKind:
    if kind.name in MODEL_KINDS:
        raise ValueError(f"model kind {kind.name!r} is already registered")
    MODEL_KINDS[kind.name] = kind
    return kind


register_model_kind(ModelKind("native", ModelConfig, "inftyformer.model:MemoryLM", MEMORY_SETTINGS))
register_model_kind(
    ModelKind(
        "pretrained",
        PretrainedMemoryConfig,
        "inftyformer.hf.lm:PretrainedMemoryLM",
        PRETRAINED_MEMORY_SETTINGS,
        extra="hf",
        frozen_base=PretrainedMemoryConfig.frozen_base,
    )
)


def frozen_base(config: Any) -> tuple[str, str] | None:
    """(directory, state-dict prefix) of the frozen pretrained base that a checkpoint of
    `config`'s model refers to instead of holding; None: the checkpoint holds every weight."""
    kind = MODEL_KINDS[model_kind(config)]
    return None if kind.frozen_base is None else kind.frozen_base(config)


def changeable_settings(config: Any) -> tuple[str, ...]:
    """The settings of `config` that a trained model may change (its weights stay usable)."""
    return MODEL_KINDS[model_kind(config)].changeable


def model_kind(config: Any) -> str:
    for kind in MODEL_KINDS.values():
        if isinstance(config, kind.config):
            return kind.name
    raise TypeError(f"not a model configuration: {type(config).__name__}")


def config_from_dict(kind: str, data: dict[str, Any]) -> Any:
    if kind not in MODEL_KINDS:
        raise ValueError(f"unknown model kind {kind!r}; known: {', '.join(MODEL_KINDS)}")
    return MODEL_KINDS[kind].config.from_dict(data)


def build_model(config: Any) -> LanguageModel:
    """The model `config` describes (weights freshly initialised, or the base's pretrained)."""
    return MODEL_KINDS[model_kind(config)].model_class()(config)


class LanguageModel(Protocol):
    """What every model kind implements (`MemoryLM`, `hf.lm.PretrainedMemoryLM`):

        model(tokens, state=, targets=, reset=, generator=) → LMOutput
            tokens [batch, L] one segment (L ≤ config.segment_len); targets [batch, L] aligned
            with them (position t predicts targets[t], −100 ignored): LMOutput.loss, .lm_loss,
            .token_loss; the new state in LMOutput.state; reset [batch] clears rows first
        init_state(batch_size, device) → an empty memory (None for a model without one)
        push(tokens, state) → the memory after streaming tokens [batch, T] of any length
        generate(prompt, max_new_tokens, temperature, top_k, top_p, state, generator, end_ids,
                 with_state) → (new tokens [batch, ≤ max_new_tokens], the memory after them)
        param_groups(lr, weight_decay) → the optimiser's parameter groups
        config.segment_len, config.vocab_size, config.model_type ("transformer": no memory),
        config.describe() (a name for the start line)

    The memory state is a `MemoryState`, passed in and returned, never kept on the model."""

    config: Any
    training: bool

    def __call__(
        self,
        tokens: torch.Tensor,
        state: MemoryState | None = None,
        targets: torch.Tensor | None = None,
        reset: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> LMOutput: ...

    def init_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> MemoryState | None: ...

    def push(
        self, tokens: torch.Tensor, state: MemoryState | None = None
    ) -> MemoryState | None: ...

    def generate(
        self,
        prompt: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        state: MemoryState | None = None,
        generator: torch.Generator | None = None,
        end_ids: Sequence[int] = (),
        with_state: bool = True,
    ) -> tuple[torch.Tensor, MemoryState | None]: ...

    def param_groups(self, lr: float, weight_decay: float) -> list[dict[str, Any]]: ...


def unwrap(model: nn.Module) -> LanguageModel:
    """The model itself, also when the trainer hands it over wrapped in DistributedDataParallel
    (the wrapper's forward synchronises gradients; everything else is the model's)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


__all__ = [
    "LanguageModel",
    "MODEL_KINDS",
    "ModelKind",
    "register_model_kind",
    "PRETRAINED_MEMORY_SETTINGS",
    "changeable_settings",
    "unwrap",
    "PretrainedMemoryConfig",
    "build_model",
    "config_from_dict",
    "frozen_base",
    "model_kind",
]
