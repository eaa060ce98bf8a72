"""A tiny stand-in for `MemoryLM` that follows its contract (explicit, detachable state; targets
with -100 ignored; `out.loss/.lm_loss/.token_loss/.aux/.state`), used to test the training engine
in isolation from the real models."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace

import torch
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 22
    model_type: str = "infty"
    d_model: int = 16
    segment_len: int = 32
    dropout: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TinyConfig:
        return cls(**data)


@dataclass
class TinyState:
    total: torch.Tensor  # [B, d] sum of embeddings seen
    count: torch.Tensor  # [B]

    def detach(self) -> TinyState:
        return TinyState(self.total.detach(), self.count.detach())

    def to(self, device) -> TinyState:
        return TinyState(self.total.to(device), self.count.to(device))

    def reset(self, rows: torch.Tensor) -> TinyState:
        keep = (~rows).to(self.total.dtype)
        return TinyState(self.total * keep[:, None], self.count * keep)


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.mix = nn.Linear(2 * cfg.d_model, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size)

    def init_state(self, batch_size: int, device=None) -> TinyState:
        d = self.config.d_model
        return TinyState(
            torch.zeros(batch_size, d, device=device), torch.zeros(batch_size, device=device)
        )

    def forward(self, tokens, state=None, targets=None, reset=None):
        if state is None:
            state = self.init_state(tokens.shape[0], tokens.device)
        if reset is not None:
            state = state.reset(reset)
        x = self.embed(tokens)  # [B, L, d]
        mean = state.total / state.count.clamp(min=1)[:, None]
        h = torch.tanh(self.mix(torch.cat([x, mean[:, None].expand_as(x)], -1)))
        logits = self.out(self.drop(h))
        new_state = TinyState(state.total + x.sum(1), state.count + tokens.shape[1]).detach()
        out = SimpleNamespace(logits=logits, state=new_state, aux={}, loss=None, lm_loss=None)
        if targets is not None:
            token_loss = nn.functional.cross_entropy(
                logits.transpose(1, 2), targets, ignore_index=-100, reduction="none"
            )
            mask = targets != -100
            out.token_loss = token_loss
            out.lm_loss = token_loss.sum() / mask.sum().clamp(min=1)
            out.aux = {"penalty": 1e-3 * self.mix.weight.pow(2).mean()}
            out.loss = out.lm_loss + out.aux["penalty"]
        return out


def tiny_config(**kw) -> TinyConfig:
    return replace(TinyConfig(), **kw)


def test_standin_follows_the_contract():
    model = TinyLM(TinyConfig())
    state = model.init_state(2)
    tokens = torch.randint(0, 22, (2, 8))
    targets = torch.full((2, 8), -100)
    targets[:, -2:] = 3
    out = model(tokens, state=state, targets=targets)
    assert out.logits.shape == (2, 8, 22)
    assert out.token_loss.shape == (2, 8)
    out.loss.backward()
    assert not out.state.total.requires_grad
