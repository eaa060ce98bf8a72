"""The read trained on the facts task: a learned map of the choosing block's queries before they
score the stored blocks (`retrieval.py`, "Which blocks"; ours, beside the training-free scores).

At `select_layer` every query head h of the call maps its query before the score,

    q'_h = W_h q_h            W_h ∈ R^{d×d}, one per query head, W_h = I untrained,

and the blocks are scored by `RetrievalConfig.score` on q'. The base is not touched: only which
blocks a call reads changes. Trained (`experiments/retrieval_trained.py`) so that the block holding
the asked fact scores above every other stored block, its alike facts (the distractors)
included, on passages of the facts task (train books, train wordings; `tasks/facts.py`).

Saved as one safetensors file: the tensor `weight` [H, d, d] and, as metadata, the base's
`select_layer`, query heads and head size it was trained for (checked when loaded).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from .._files import atomic_path

FIELDS = ("select_layer", "heads", "head_dim")


class QueryMapError(ValueError):
    """A query-map file is missing, corrupt, or made for another base or choosing block."""


class QueryMap(nn.Module):
    """q'_h = W_h q_h for the queries [b, H, T, d] of one block (module doc)."""

    def __init__(self, heads: int, head_dim: int, select_layer: int) -> None:
        super().__init__()
        self.select_layer = int(select_layer)
        eye = torch.eye(head_dim).expand(heads, head_dim, head_dim)
        self.weight = nn.Parameter(eye.clone())  # [H, d, d], W_h = I: the untrained scores

    @property
    def heads(self) -> int:
        return self.weight.shape[0]

    @property
    def head_dim(self) -> int:
        return self.weight.shape[1]

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        if query.dim() != 4 or query.shape[1] != self.heads or query.shape[3] != self.head_dim:
            raise ValueError(
                f"queries must be [batch, {self.heads}, tokens, {self.head_dim}], got "
                f"{list(query.shape)}"
            )
        w = self.weight.to(query.dtype)
        return torch.einsum("hed,bhtd->bhte", w, query)  # [b, H, T, d]

    def save(self, path: str | Path) -> Path:
        """Write the map to `path` (.safetensors), whole or not at all."""
        from safetensors.torch import save_file

        path = Path(path)
        meta = {"select_layer": str(self.select_layer), "heads": str(self.heads),
                "head_dim": str(self.head_dim)}  # fmt: skip
        with atomic_path(path) as tmp:
            save_file({"weight": self.weight.detach().float().contiguous()}, str(tmp), meta)
        return path

    @classmethod
    def load(cls, path: str | Path) -> QueryMap:
        from safetensors import SafetensorError, safe_open

        path = Path(path)
        if not path.is_file():
            raise QueryMapError(f"query map {path}: no such file")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                weight = f.get_tensor("weight")
            sizes = {k: int(meta[k]) for k in FIELDS}
        except (SafetensorError, OSError, KeyError, ValueError) as err:
            raise QueryMapError(
                f"query map {path} is corrupt or not a query map ({type(err).__name__}: {err})"
            ) from err
        H, d = sizes["heads"], sizes["head_dim"]
        if tuple(weight.shape) != (H, d, d):
            shape = list(weight.shape)
            raise QueryMapError(f"query map {path}: weight {shape}, not [{H}, {d}, {d}]")
        if not torch.isfinite(weight).all():
            raise QueryMapError(f"query map {path}: its weight holds NaN or inf")
        out = cls(H, d, sizes["select_layer"])
        with torch.no_grad():
            out.weight.copy_(weight)
        return out

    @classmethod
    def load_for(cls, path: str | Path, heads: int, head_dim: int, select_layer: int) -> QueryMap:
        """The map at `path`, refused unless made for these query heads, head size and
        choosing block; frozen (read, not trained)."""
        out = cls.load(path)
        have = (out.heads, out.head_dim, out.select_layer)
        if have != (heads, head_dim, select_layer):
            raise QueryMapError(
                f"query map {path}: made for {have[0]} query heads of {have[1]} at block "
                f"{have[2]}, the model chooses with {heads} heads of {head_dim} at block "
                f"{select_layer}"
            )
        return out.requires_grad_(False)


__all__ = ["QueryMap", "QueryMapError"]
