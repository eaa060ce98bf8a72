"""The places of a squeeze="fill" memory (`long_term_memory.py`): K places on the basis centres,
one token each until the memory is full, then equal runs of the stream, and where each lies.

    pool_by_length   the K places after L new tokens: place k = the mean of the stream over
                     [k r, (k + 1) r), r = max((S + L) / K, 1), the first `keep` tokens never
                     merged (a pretrained model's attention sink)
    place_positions  the mean token index of each place: where a read that knows positions
                     (a pretrained model's rotary attention, `hf/head_read.py`) puts its key
"""

from __future__ import annotations

import torch


def pool_by_length(
    old: torch.Tensor, stored: torch.Tensor, new: torch.Tensor, keep: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The places of a squeeze="fill" memory after L new tokens, each the mean of an equal run of
    the stream.

    old     [batch, K, e]   the K places before: the first P = min(S, K) hold the stream of
                            S = `stored` tokens [batch] (S / P tokens each, in order), the rest
                            nothing
    new     [batch, L, e]   the new tokens, one each
    →       [batch, K, e]   place k holds the mean of the stream over [k r, (k + 1) r) on the
                            token axis, r = max((S + L) / K, 1): one token per place until the
                            memory is full, then neighbouring places merged so that every place
                            stands for (S + L) / K tokens; the places past S + L are zero
            [batch]         P' = min(S + L, K): the places that hold the stream

    `keep`: the first places keep the stream's first tokens, one each, and are never merged
    (a pretrained model's attention sink); the rest of the stream shares the other K − keep.
    """
    if not keep:
        ones = torch.ones(new.shape[:2], device=old.device, dtype=torch.float64)
        return _pool(old, stored, new, ones)
    batch, K, _ = old.shape
    L = new.shape[1]
    S = stored.to(old.device)
    # a row that holds fewer than `keep` tokens is still filling, one token per place: its next
    # tokens go to the kept places first (`taken` of them), the rest of the stream after them
    taken = (keep - S).clamp(min=0)  # [batch]
    j = torch.arange(L, device=old.device)
    rest, rest_filled = _pool(
        old[:, keep:], (S - keep).clamp(min=0), new, (j >= taken[:, None]).to(torch.float64)
    )
    k = torch.arange(keep, device=old.device)
    # kept place k: old place k while k < S, then new token k − S (nothing past S + L)
    source = torch.where(k < S[:, None], k, keep + k - S[:, None]).clamp(max=keep + L - 1)
    both = torch.cat([old[:, :keep], new.to(old.dtype)], 1)  # [batch, keep + L, e]
    head = torch.gather(both, 1, source[..., None].expand(-1, -1, old.shape[-1]))
    head = head * (k < (S + L)[:, None])[..., None].to(old.dtype)
    filled = torch.where(S + L <= keep, S + L, keep + rest_filled)
    return torch.cat([head, rest], 1), filled.to(torch.int64)


def _pool(
    old: torch.Tensor, stored: torch.Tensor, new: torch.Tensor, new_width: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pool_by_length` without a kept prefix, the new tokens weighted by `new_width` [batch, L]
    (1: a token of the stream, 0: not part of it).

    The stream is piecewise constant over its units (old places of width S / P, new tokens of
    width 1); the mean over [a, b) is (C(b) − C(a)) / r with C its running integral, computed
    in float64 (C grows with the stream). A unit of width 0 shares its left edge with the unit
    after it, which the search below picks instead."""
    batch, K, _ = old.shape
    L = new.shape[1]
    S = stored.to(device=old.device, dtype=torch.float64)  # [batch]
    P = S.clamp(max=K)
    j = torch.arange(K, device=old.device, dtype=torch.float64)
    # the width of each unit on the token axis: S / P per filled old place, 1 per new token
    width = torch.cat(
        [torch.where(j < P[:, None], S[:, None] / P.clamp(min=1)[:, None], 0.0), new_width], -1
    )  # [batch, K + L]
    units = torch.cat([old, new], 1).to(torch.float64)  # [batch, K + L, e]
    left = torch.cumsum(width, -1) - width  # the units' left edges [batch, K + L]
    C = torch.cumsum(width[..., None] * units, 1) - width[..., None] * units  # C at left edges
    T = S + new_width.sum(-1)
    r = (T / K).clamp(min=1)[:, None]  # tokens per place [batch, 1]
    a = torch.minimum(torch.arange(K + 1, device=old.device, dtype=torch.float64) * r, T[:, None])
    # C(a) = C(left_m) + x_m (a − left_m) for the unit m that holds a (the last with left_m ≤ a)
    m = (torch.searchsorted(left, a, right=True) - 1).clamp(0, K + L - 1)  # [batch, K + 1]
    gather = lambda v: torch.gather(v, 1, m[..., None].expand(-1, -1, v.shape[-1]))  # noqa: E731
    C_a = gather(C) + gather(units) * (a - torch.gather(left, 1, m))[..., None]
    places = (C_a[:, 1:] - C_a[:, :-1]) / r[..., None]  # [batch, K, e]
    return places.to(old.dtype), T.clamp(max=K).to(torch.int64)


def place_positions(stored: torch.Tensor, num_places: int, keep: int = 0) -> torch.Tensor:
    """Where each place of a squeeze="fill" memory lies in its stream, on the token axis: the
    mean index of the tokens `pool_by_length` averaged into it (float64 [batch, K] for
    S = `stored` [batch] tokens; the places past the stream are not read, their value is k).

        S ≤ K       place k holds token k                                   p_k = k
        S > K       places k < keep hold tokens k                           p_k = k
                    the others equal runs of r = (S − keep) / (K − keep) tokens
                                                      p_k = keep + (k − keep + ½) r − ½

    A read that knows each place's position (`hf/head_read.py`, memory_positions="places")
    turns its keys by them, as a pretrained model's rotary attention turns a token's key."""
    S = stored.to(torch.float64)[:, None]  # [batch, 1]
    k = torch.arange(num_places, dtype=torch.float64, device=stored.device)  # [K]
    r = (S - keep) / (num_places - keep)  # tokens per merged place
    merged = keep + (k - keep + 0.5) * r - 0.5
    return torch.where((S <= num_places) | (k < keep), k, merged)


__all__ = ["place_positions", "pool_by_length"]
