"""Which stored blocks a retrieval memory reads (`retrieval.py`, module doc "Which blocks"):
each block's score [b, n] against a call's queries under "max", "mean" or "attention" (the
stored keys read in parts of `PART` tokens, so that no [queries × all tokens] tensor is ever
whole), and the `k` blocks chosen by it, in the order they are read."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch

from .config import SCORES

PART = 4096  # stored tokens scored at once


def parts(keys: torch.Tensor | Sequence[torch.Tensor], block: int) -> list[torch.Tensor]:
    """The stored keys [b, n·B, Hkv, d], or their chunks (`RetrievalState.keys`), in parts
    of whole blocks of at most about `PART` tokens, in stream order."""
    if isinstance(keys, torch.Tensor):
        return list(keys.split(max(1, PART // block) * block, 1))
    return [p for chunk in keys for p in parts(chunk, block)]


def block_scores(
    query: torch.Tensor, keys: torch.Tensor | Sequence[torch.Tensor], stored: torch.Tensor,
    kv_heads: int, block: int, score: str,
) -> torch.Tensor:  # fmt: skip
    """Every stored block's score [b, n] under the queries [b, H, T, d] (the grouped-query
    heads kept grouped over `kv_heads`), against the stored keys [b, n·B, Hkv, d] of blocks of
    B = `block` tokens (or their chunks along the tokens, `RetrievalState.keys`); −inf where
    `stored` [b, n] is False (a row holding fewer blocks).

        max        the block's best q · k / √d over the call's queries, heads and its tokens
        mean       the best over its tokens of the mean over the call's queries of the best
                   over heads
        attention  `attention_score`"""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}")
    b, H, T, d = query.shape
    n = stored.shape[1]
    split = parts(keys, block)
    tokens = sum(p.shape[1] for p in split)
    if tokens != n * block:
        raise ValueError(f"{n} blocks of {block} stored, but keys for {tokens} tokens")
    if n == 0:
        return torch.zeros(b, 0, device=query.device)
    q = query.float().view(b, kv_heads, H // kv_heads, T, d) / math.sqrt(d)
    if score == "attention":
        out = attention_score(q, split, stored, block)
    else:
        best = []  # each part's blocks' scores  [b, n'/B]
        for s in part_scores(q, split):  # [b, Hkv, G, T, n']
            token = s.amax((1, 2, 3)) if score == "max" else s.amax((1, 2)).mean(1)  # [b, n']
            best.append(token.unflatten(1, (-1, block)).amax(-1))
        out = torch.cat(best, 1)  # [b, n]
    return out.masked_fill(~stored, -math.inf)


def part_scores(q: torch.Tensor, split: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
    """q · k [b, Hkv, G, T, n'] of the queries q [b, Hkv, G, T, d] (scaled) against each part
    [b, n', Hkv, d] of the stored keys in turn, each written over the last (use one before
    asking for the next). The scores and the keys in float32 live in two buffers made once per
    call at the largest part's size: the same sizes call after call however long the stream,
    where a part's own tensors would grow a little every call (the last part fills up) and
    leave the allocator a hole too small for the next call's, the process's resident memory
    creeping up with the stream."""
    b, Hkv, G, T, d = q.shape
    width = max((p.shape[1] for p in split), default=0)
    scores = q.new_empty(b * Hkv * G * T * width)
    keys = q.new_empty(b * Hkv * width * d)
    queries = q.reshape(b, Hkv, G * T, d)
    for part in split:
        m = part.shape[1]
        k = keys[: b * Hkv * m * d].view(b, Hkv, m, d)
        k.copy_(part.transpose(1, 2))  # float16 → float32, heads first
        s = scores[: b * Hkv * G * T * m].view(b, Hkv, G * T, m)
        torch.matmul(queries, k.transpose(-1, -2), out=s)
        yield s.view(b, Hkv, G, T, m)


def attention_score(
    q: torch.Tensor, keys: torch.Tensor | Sequence[torch.Tensor], stored: torch.Tensor,
    block: int,
) -> torch.Tensor:  # fmt: skip
    """score="attention": each block's best attention weight from any of the call's queries
    and heads when that query attends over every stored token alone,
    max_{h,t} max_{j ∈ block} exp(q_ht · k_j − log Σ_{j' stored} exp(q_ht · k_j')),
    in logs. A query that matches many blocks alike (a word every needle shares) spreads its
    weight over them; one that matches a single block (the asked key) gives it nearly all.
    q [b, Hkv, G, T, d] (scaled), keys [b, n·B, Hkv, d] (or their chunks), stored [b, n] →
    [b, n]; one pass over the keys in `parts`, keeping each part's log-sum-exp and its blocks'
    best raw scores per query ([b, Hkv, G, T, n]: B times smaller than the scores)."""
    valid = stored.repeat_interleave(block, 1)  # [b, n·B]
    lse, block_max = [], []
    split = parts(keys, block)
    sizes = [p.shape[1] for p in split]
    for s, ok in zip(part_scores(q, split), valid.split(sizes, 1), strict=True):
        s.masked_fill_(~ok[:, None, None, None], -math.inf)  # [b, Hkv, G, T, n']
        lse.append(torch.logsumexp(s, -1))  # [b, Hkv, G, T]
        block_max.append(s.unflatten(-1, (-1, block)).amax(-1))  # [b, Hkv, G, T, n'/B]
    total = torch.logsumexp(torch.stack(lse, -1), -1)  # [b, Hkv, G, T]
    weight = torch.cat(block_max, -1) - total[..., None]  # log attention, [b, Hkv, G, T, n]
    weight = weight.masked_fill(weight.isnan(), -math.inf)  # nothing stored: −inf − (−inf)
    return weight.amax((1, 2, 3))  # [b, n]


def choose(
    score: torch.Tensor, stored: torch.Tensor, k: int, neighbours: int = 0, by_score: bool = False
) -> torch.Tensor:
    """The `k` best blocks [b, k] by `score` [b, n] (`stored` [b, n]: a row's blocks; where
    it holds fewer than k, unstored ones fill the rest): with `neighbours`, the best k / (1 +
    neighbours) first, each with the blocks right after it, then the next best. In stream
    order, or (`by_score`) by rising score, the best read last, a lead's neighbours right
    after it as in the stream."""
    n = score.shape[1]
    rank = score  # what orders the chosen blocks by_score  [b, n]
    if neighbours:
        m = neighbours + 1
        lead = score.topk(max(1, k // m), dim=1)  # [b, k']
        follow = lead.indices[:, :, None] + torch.arange(m, device=score.device)  # [b, k', m]
        follow = follow.flatten(1).clamp(max=n - 1)
        first = torch.zeros_like(stored).scatter(1, follow, True) & stored
        # a neighbour ranks with its lead (the best lead holding it), read right after it
        group = torch.full_like(score, -math.inf).scatter_reduce(
            1, follow, lead.values.repeat_interleave(m, 1), "amax"
        )  # fmt: skip
        rank = torch.maximum(score, group)
        score = score.masked_fill(first, math.inf)  # then the next best fill what is left
    order = score.topk(k, dim=1).indices.sort(1).values  # stream order
    if by_score:  # by rising rank, the best read last, right before the window
        rising = torch.gather(rank, 1, order).sort(dim=1, stable=True).indices
        order = torch.gather(order, 1, rising)  # ties (a lead, its neighbours): stream order
    return order


__all__ = ["PART", "attention_score", "block_scores", "choose", "part_scores", "parts"]
