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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from .native.model import LMOutput
from .native.model_config import ModelConfig
from .native.model_config import changeable_settings as native_changeable
from .native.state import MemoryState
from .pretrained_config import PretrainedMemoryConfig, pretrained_changeable


@dataclass(frozen=True)
class ModelKind:
    """One kind of model: its settings (`config`) and its model class, named by import path and
    imported when the first model is built, so that a kind whose module builds on this one (the
    pretrained adapter in `inftyformer.hf`) or needs an extra is not imported with it."""

    name: str
    config: type
    model: str  # "module:Class"
    # the settings a trained model may change (resume, evaluation), asked when needed: they
    # include those of every strategy registered by then
    changeable: Callable[[], tuple[str, ...]]
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


register_model_kind(
    ModelKind("native", ModelConfig, "inftyformer.native.model:MemoryLM", native_changeable)
)
register_model_kind(
    ModelKind(
        "pretrained",
        PretrainedMemoryConfig,
        "inftyformer.hf.pretrained_lm:PretrainedMemoryLM",
        pretrained_changeable,
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
    return MODEL_KINDS[model_kind(config)].changeable()


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
    """What every model kind implements (`MemoryLM`, `hf.pretrained_lm.PretrainedMemoryLM`):

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
    "changeable_settings",
    "unwrap",
    "PretrainedMemoryConfig",
    "build_model",
    "config_from_dict",
    "frozen_base",
    "model_kind",
]
