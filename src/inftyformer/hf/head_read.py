"""The long-term memory read by the base's own attention heads (`memory_read="heads"`, ours, not
the paper's; `docs/hf.md`, `docs/results/passkey.md`).

The paper's read on a pretrained model (`memory_read="added"`, §4.2) has its own W^Q, W^K, W^V and
output projection, starts at zero and has to learn, through the frozen blocks above it, both
where to read and what the read means. A pretrained model already knows both for text inside its
window: some of its heads attend to the token they need wherever it stands. Here every head of a
memory block reads the memory as it would read that text:

    q = R_Δ W_q h                  the head's own query (rotary bases: rotated as if the memory
                                   sat Δ = W tokens back, just beyond the window)
    k(c_n) = x̄(c_n) W_k           the head's own keys at the basis centres (x̄: the signal of the
    v(t) = x̄(t) W_v               block's normalised attention inputs), its own values
    s_n = q · k(c_n) / √d          (grouped-query heads: each reads its key/value group's)

The content density (`core/attention.py`, sharpened by β = `sharpness`, the oldest edge
before `sink_edge` not read) gives μ, σ² and z = E_p[v(t)] per head. The read enters the head's
own softmax by its mass, as the memory's places would if they were tokens of the window: with
Z_W = Σ_window exp(s_j) (recorded by the attention function registered here, `log_window_mass`)
and Z_M = Σ_n exp(s_n) (`HeadsRead.log_mass`, one place per centre),

    o_h = (Z_W o_W + Z_M z) / (Z_W + Z_M) = o_W + λ (z − o_W),   λ = sigmoid(log Z_M − log Z_W)

so a head whose window holds a better match keeps its own output and a head whose best match left
the window reads it from the memory. The output projection W_o is the base's. W^Q, W^K, W^V are
initialised from the base's projections (`init_from_heads`) and stay trainable; the read's own
output projection is not used. Unlike the added read, this one is not zero at initialisation: a
model with memory differs from the base as soon as its memory holds something (with an empty
memory, λ = 0 and the logits are the base's).

Positions (rotary bases). By default (`memory_positions="window"`) every place is read at one
distance, Δ = W: the query projection is R_Δ W_q, and a place's key carries no position. With
`memory_positions="places"` (squeeze="fill"), each place keeps where its tokens lie in the stream
(`places.place_positions`: token k, or the middle of its run once places merge), and
the read turns query and key by their own positions as the base's attention does:

    q = R_{i} W_q h                the head's own query at its position i in this call (the base's
                                   position ids: the window starts at 0)
    k(c_n) = R_{p_n − S} x̄(c_n) W_k  place n before the window, S = the tokens the memory holds,
                                   p_n − S ≥ max_i i − (P − 1), P = the base's positions

so that q · k depends on i + S − p_n, the distance in the stream, as it would if the place were a
token of the window, and no place sits further from a query than the base has positions for
(older places share the farthest position: `read_at_places`).

With `memory_positions="ranks"` each place sits at its rank instead, p_n = n + max(S − K, 0)
(`places.rank_positions`): the K places read as if they were the last K tokens before
the window. While every place holds one token this is "places"; once places merge, neighbouring
places stay one position apart, so a key kept whole keeps its tokens in order one position
apart however far back it lies, and no place is ever further than K tokens before the window
(with "places", everything older than the base's positions shares the farthest one).
"""

from __future__ import annotations

import contextvars
import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from ..core.attention import HeadsRead, LongTermAttention
from ..core.density import PreparedMemory
from ..core.state import LongTermState
from ..extensions.places import rank_positions

# the attention implementation a heads-read model runs its base with (registered below)
ATTENTION = "inftyformer_heads"


@dataclass
class WindowMass:
    """One call's log Z_W per attention module that a memory block merges into."""

    wanted: set[int]  # id() of the attention modules
    log_mass: dict[int, torch.Tensor] = field(default_factory=dict)  # id → [batch, H, T]


_RECORD: contextvars.ContextVar[WindowMass | None] = contextvars.ContextVar(
    "inftyformer_window_mass", default=None
)


def recording(mass: WindowMass) -> contextvars.Token:
    """Record log Z_W into `mass` until `_RECORD.reset(token)`."""
    return _RECORD.set(mass)


def stop_recording(token: contextvars.Token) -> None:
    _RECORD.reset(token)


def window_attention(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The base's attention (query [b, H, T, d], key/value [b, H_kv, S, d], an additive mask
    [b, 1, T, S]), also giving log Z_W = logsumexp_j s_j [b, H, T] for the modules a memory
    block merges into; every other module runs PyTorch's scaled-dot-product attention."""
    mass = _RECORD.get()
    if mass is None or id(module) not in mass.wanted:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]  # grouped-query heads share a key/value head
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    s = torch.matmul(query, key.transpose(-1, -2)) * scale  # s_j  [b, H, T, S]
    if attention_mask is not None:
        s = s + attention_mask[..., : key.shape[-2]]
    log_mass = torch.logsumexp(s, dim=-1)  # log Z_W  [b, H, T]
    mass.log_mass[id(module)] = log_mass
    p = torch.exp(s - log_mass.unsqueeze(-1))
    if dropout > 0.0 and module.training:
        p = F.dropout(p, p=dropout)
    out = torch.matmul(p, value)  # o_W  [b, H, T, d]
    return out.transpose(1, 2).contiguous(), None  # [b, T, H, d], as HF's functions return


AttentionInterface.register(ATTENTION, window_attention)
AttentionMaskInterface.register(ATTENTION, eager_mask)


# ---------------------------------------------------------------------- the base's projections
@dataclass
class HeadProjections:
    """A block's attention projections, per head in the memory's layout ([H·d, e], head h in
    rows h·d … (h + 1)·d − 1, grouped-query keys/values repeated for their heads)."""

    query: torch.Tensor
    query_bias: torch.Tensor | None
    key: torch.Tensor
    value: torch.Tensor
    value_bias: torch.Tensor | None  # [H·d]: added to the read (∫ p = 1)
    num_heads: int


def head_projections(attention: nn.Module, num_heads: int) -> HeadProjections:
    """The projections of a Llama-family (q/k/v_proj) or GPT-2 (fused c_attn) attention module."""
    if hasattr(attention, "q_proj"):
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        e = q.weight.shape[1]
        d = q.weight.shape[0] // num_heads
        groups = num_heads // (k.weight.shape[0] // d)

        def per_head(w: torch.Tensor) -> torch.Tensor:  # [H_kv·d, e] → [H·d, e]
            return w.view(-1, d, e).repeat_interleave(groups, 0).reshape(-1, e)

        v_bias = value_bias(attention, num_heads)
        return HeadProjections(
            q.weight, q.bias, per_head(k.weight), per_head(v.weight), v_bias, num_heads
        )
    if hasattr(attention, "c_attn"):  # GPT-2's Conv1D: y = x W + b, W [e, 3e]
        w, b = attention.c_attn.weight, attention.c_attn.bias
        e = w.shape[0]
        v_bias = value_bias(attention, num_heads)
        return HeadProjections(
            w[:, :e].t(), b[:e], w[:, e : 2 * e].t(), w[:, 2 * e :].t(), v_bias, num_heads
        )
    raise ValueError(f"no query/key/value projections found in {type(attention).__name__}")


def value_bias(attention: nn.Module, num_heads: int) -> torch.Tensor | None:
    """The value projection's bias per head [H·d] (grouped-query heads repeated), or None: what
    a merge adds to each read (the read's own W^V has no bias; ∫ p = 1). Only the bias is built,
    so that the merge, which runs in every call, copies no weight matrix."""
    if hasattr(attention, "v_proj"):
        bias = attention.v_proj.bias
        if bias is None:
            return None
        d = attention.q_proj.weight.shape[0] // num_heads
        groups = num_heads * d // bias.shape[0]
        return bias.view(-1, d).repeat_interleave(groups, 0).view(-1)
    if hasattr(attention, "c_attn"):
        e = attention.c_attn.weight.shape[0]
        return attention.c_attn.bias[2 * e :]
    raise ValueError(f"no value projection found in {type(attention).__name__}")


def rotate_half(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """(x₁, x₂) → (−x₂, x₁) along `dim`: the rotary embedding's rotate-half convention."""
    first, second = x.chunk(2, dim)
    return torch.cat([-second, first], dim)


def turn(x: torch.Tensor, rotary: nn.Module, positions: torch.Tensor) -> torch.Tensor:
    """x [b, H, T, d] turned by the rotary embedding `rotary` to positions [b, T] (float: a
    place may sit between tokens): x cos + rotate_half(x) sin, as the base turns its own."""
    cos, sin = rotary(x, positions)  # [b, T, d]
    return x * cos[:, None] + rotate_half(x) * sin[:, None]


def read_at_places(
    read: LongTermAttention,
    q: torch.Tensor,
    state: LongTermState,
    prepared: PreparedMemory,
    positions: torch.Tensor,
    rotary: nn.Module,
    limit: int | None,
    ranks: bool = False,
) -> HeadsRead:
    """The heads read with every place at its own stream position (module doc, "Positions"):
    q [b, H, T, d] each head's query (`LongTermAttention.project_queries` of the block's
    normalised attention inputs) at the base's position ids `positions` [b, T] (the window's
    first token at 0), `limit` the base's number of positions; `ranks`: each place at its rank
    instead (the places as the last tokens before the window)."""
    c = read.config
    stored = state.stored.to(positions.device)  # S  [b]
    # p_n − S: the places before the window, at negative positions  [b, N]
    K = read.basis.num_centers  # places: one per centre (N / number of widths)
    if ranks:  # p_k = k + max(S − K, 0): the newest place just before the window
        at = rank_positions(stored, K)
    else:  # where the squeeze's places lie in the stream
        at = c.squeeze.positions(state, K).to(positions.device)
    places = at - stored[:, None].double()
    places = places.repeat(1, c.num_basis // K)  # basis function l·K + k sits on centre k
    if limit is not None:  # no place further from this call's last query than P − 1
        farthest = positions.max(1, keepdim=True).values.double() - (limit - 1)
        places = torch.maximum(places, farthest)
    keys = turn(prepared.keys, rotary, places.float())  # R_{p_n − S} k(c_n) / √d
    q = turn(q, rotary, positions.float())  # R_i W_q h
    return read(q, state, prepared=replace(prepared, keys=keys), heads=True)


def add_token_mass(heads: HeadsRead, state: LongTermState, prepared: PreparedMemory) -> HeadsRead:
    """`token_mass`: the memory's attention mass counts the tokens each place stands for,
    log Z_M + log(S / places read) for S stored tokens, so that a memory of 256 tokens over
    2,048 places does not weigh as 2,048 tokens against the window (`HeadsRead`)."""
    r = prepared.readable  # a memory that fills its centres one by one: the filled ones only
    # the basis functions read: every one, or the filled centres only
    places = state.coefficients.shape[1] if r is None else r.sum(-1).to(torch.float64)
    per_place = (state.stored.to(torch.float64) / places).clamp(min=1e-30)  # [b]
    log_mass = heads.log_mass + per_place.log().to(heads.log_mass)[:, None, None]
    return replace(heads, log_mass=log_mass)


def rotate_queries(weight: torch.Tensor, bias, num_heads: int, cos, sin):
    """R_Δ W_q (and R_Δ b_q): the rotary rotation of a fixed position applied to the rows of a
    query projection [H·d, e] (rotate-half convention); cos, sin [d]."""

    def rotate(x: torch.Tensor) -> torch.Tensor:  # x [H, d, ...]
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return x * cos.view(shape) + rotate_half(x, 1) * sin.view(shape)

    d = weight.shape[0] // num_heads
    w = rotate(weight.view(num_heads, d, -1)).reshape(weight.shape)
    b = None if bias is None else rotate(bias.view(num_heads, d)).reshape(bias.shape)
    return w, b


@torch.no_grad()
def init_from_heads(layer, attention: nn.Module, num_heads: int, rotary=None, delta=0) -> None:
    """W^Q, W^K, W^V of `layer` (a LayerMemory) from the base attention's projections; with a
    rotary module (Llama's `rotary_emb`), W^Q rotated to position Δ = `delta`."""
    p = head_projections(attention, num_heads)
    read = layer.attention
    query, query_bias = p.query, p.query_bias
    if rotary is not None:
        d = query.shape[0] // num_heads
        probe = query.new_zeros(1, 1, d)
        cos, sin = rotary(probe, torch.tensor([[int(delta)]], device=query.device))
        query, query_bias = rotate_queries(query, query_bias, num_heads, cos[0, 0], sin[0, 0])
    read.query.weight.copy_(query)
    if query_bias is None:
        read.query.bias.zero_()
    else:
        read.query.bias.copy_(query_bias)
    read.key.weight.copy_(p.key)
    read.value.weight.copy_(p.value)


# ---------------------------------------------------------------------- the merge
def merge_into_heads(
    output: torch.Tensor,
    heads_in: torch.Tensor,
    read: HeadsRead,
    log_window_mass: torch.Tensor,
    projection: nn.Module,
    value_bias: torch.Tensor | None,
) -> torch.Tensor:
    """The attention output with each head's memory read merged in by mass (module doc):
    output = W_o o + b_o [b, T, e], heads_in = o [b, T, H·d], log_window_mass log Z_W
    [b, H, T], `projection` W_o (nn.Linear or GPT-2's Conv1D)."""
    b, T, _ = heads_in.shape
    H = read.z.shape[1]
    o_w = heads_in.view(b, T, H, -1).transpose(1, 2)  # [b, H, T, d]
    z = read.z.to(o_w.dtype)
    if value_bias is not None:
        z = z + value_bias.view(1, H, 1, -1).to(z.dtype)
    lam = torch.sigmoid(read.log_mass - log_window_mass).to(o_w.dtype)  # λ  [b, H, T]
    delta = (lam.unsqueeze(-1) * (z - o_w)).transpose(1, 2).reshape(b, T, -1)  # λ (z − o_W)
    if isinstance(projection, nn.Linear):
        return output + F.linear(delta, projection.weight)
    return output + delta @ projection.weight  # Conv1D: x W


__all__ = [
    "ATTENTION",
    "HeadProjections",
    "WindowMass",
    "head_projections",
    "init_from_heads",
    "merge_into_heads",
    "add_token_mass",
    "read_at_places",
    "recording",
    "rotate_half",
    "rotate_queries",
    "turn",
    "value_bias",
    "stop_recording",
    "window_attention",
]
