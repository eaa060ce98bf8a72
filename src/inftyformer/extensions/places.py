"""The places of a squeeze="fill" memory (`squeezes.FillSqueeze`): K places on the basis centres,
one token each until the memory is full, then equal runs of the stream, and where each lies.

    pool_by_length   the K places after L new tokens: place k = the mean of the stream over
                     [k r, (k + 1) r), r = max((S + L) / K, 1), the first `keep` tokens never
                     merged (a pretrained model's attention sink), nor the last `keep_last`
                     (the recent past kept exact, the older past merged)
    place_positions  the mean token index of each place: where a read that knows positions
                     (a pretrained model's rotary attention, `hf/head_read.py`) puts its key
    rank_positions   or each place at its rank: the places as the last tokens before the
                     window, one position apart, never further back than K
    pool_salient     `pool_by_length` with B more places kept for single tokens: the most
                     salient of the tokens between the kept ones (the text right after the
                     model was surprised, `salience`); the places' records (span, tokens,
                     salience) are kept in the state, as they no longer follow from S alone
"""

from __future__ import annotations

import torch


def pool_by_length(
    old: torch.Tensor, stored: torch.Tensor, new: torch.Tensor, keep: int = 0, keep_last: int = 0
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
    `keep_last`: once the memory is full, the last places hold the stream's last tokens, one
    each; only the tokens between the kept ones share the middle places (`_pool_kept`).
    """
    if not keep and not keep_last:
        return _pool(old, stored, new)
    return _pool_kept(old, stored, new, keep, keep_last)


def _pool(
    old: torch.Tensor, stored: torch.Tensor, new: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pool_by_length` with no token kept: the whole stream in K equal runs."""
    K, L = old.shape[1], new.shape[1]
    S = stored.to(device=old.device, dtype=torch.float64)  # [batch]
    P = S.clamp(max=K)
    j = torch.arange(K, device=old.device, dtype=torch.float64)
    # the width of each unit on the token axis: S / P per filled old place, 1 per new token
    width = torch.cat(
        [
            torch.where(j < P[:, None], S[:, None] / P.clamp(min=1)[:, None], 0.0),
            torch.ones(old.shape[0], L, device=old.device, dtype=torch.float64),
        ],
        -1,
    )  # [batch, K + L]
    T = S + L
    places = _runs(torch.cat([old, new], 1), width, T, K)
    return places.to(old.dtype), T.clamp(max=K).to(torch.int64)


def _runs(units: torch.Tensor, width: torch.Tensor, T: torch.Tensor, K: int) -> torch.Tensor:
    """The means of a stream over K equal runs of r = max(T / K, 1) tokens (float64 [batch, K, e];
    the runs past T are zero): the stream is piecewise constant over its `units` [batch, U, e],
    unit m `width` [batch, U] tokens wide (float64), T [batch] tokens in all.

    The mean over [a, b) is (C(b) − C(a)) / r with C the running integral, computed in float64
    (C grows with the stream). A unit of width 0 is not part of the stream: it shares its left
    edge with the unit after it, which the search below picks instead."""
    U = units.shape[1]
    units = units.to(torch.float64)
    left = torch.cumsum(width, -1) - width  # the units' left edges [batch, U]
    C = torch.cumsum(width[..., None] * units, 1) - width[..., None] * units  # C at left edges
    r = (T / K).clamp(min=1)[:, None]  # tokens per place [batch, 1]
    a = torch.minimum(torch.arange(K + 1, device=units.device, dtype=torch.float64) * r, T[:, None])
    # C(a) = C(left_m) + x_m (a − left_m) for the unit m that holds a (the last with left_m ≤ a)
    m = (torch.searchsorted(left, a, right=True) - 1).clamp(0, U - 1)  # [batch, K + 1]
    gather = lambda v: torch.gather(v, 1, m[..., None].expand(-1, -1, v.shape[-1]))  # noqa: E731
    C_a = gather(C) + gather(units) * (a - torch.gather(left, 1, m))[..., None]
    return (C_a[:, 1:] - C_a[:, :-1]) / r[..., None]  # [batch, K, e]


def _pool_kept(
    old: torch.Tensor, stored: torch.Tensor, new: torch.Tensor, keep: int, keep_last: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`pool_by_length` with the first `keep` and the last `keep_last` tokens never merged. The K
    places of a stream of S tokens:

        S ≤ K   place k holds token k (the places past S nothing)
        S > K   places k < keep token k; the last keep_last places the tokens S − keep_last …
                S − 1; the middle K − keep − keep_last places equal runs of the tokens between

    After L new tokens (T = S + L): the kept places are tokens gathered from the old places and
    the new tokens, and the middle pools the stream over [keep, T − keep_last): the old middle
    places (S > K; (S − keep − keep_last) / (K − keep − keep_last) tokens each), the old places
    and the new tokens whose token lies there (1 each), every other unit 0 wide."""
    batch, K, e = old.shape
    L = new.shape[1]
    S = stored.to(old.device)[:, None]  # [batch, 1]
    T = S + L
    middle = K - keep - keep_last  # places of the merged runs
    k = torch.arange(K, device=old.device)
    j = torch.arange(L, device=old.device)
    merged = S > K  # the old places: head, runs, tail
    tail = k >= K - keep_last
    alone = ~merged | (k < keep) | tail  # old places holding one token each  [batch, K]
    token = torch.where(merged & tail, S - K + k, k)  # the token of such a place
    # the middle of the new stream, tokens [keep, T − keep_last)
    inside = lambda s: (s >= keep) & (s < T - keep_last)  # noqa: E731
    run = (S.to(torch.float64) - keep - keep_last) / middle  # tokens per old middle place
    width = torch.cat(
        [
            torch.where(alone, (inside(token) & (token < S)).to(torch.float64), run),
            inside(S + j).to(torch.float64),
        ],
        -1,
    )  # [batch, K + L]
    M = (T - keep - keep_last).clamp(min=0)[:, 0].to(torch.float64)
    runs = _runs(torch.cat([old, new], 1), width, M, middle).to(old.dtype)
    # the tokens kept one each: place k holds token k (filling or k < keep) or T − K + k (tail)
    full = T > K
    wanted = torch.where(full & tail, T - K + k, k)  # [batch, K]
    # where it is in [old places, new tokens]: a new token at K + s − S, an old one on its place
    source = torch.where(
        wanted >= S, K + wanted - S, torch.where(merged & (wanted >= keep), K - S + wanted, wanted)
    ).clamp(0, K + L - 1)  # (a middle place's is not used)
    both = torch.cat([old, new.to(old.dtype)], 1)  # [batch, K + L, e]
    kept = torch.gather(both, 1, source[..., None].expand(-1, -1, e))
    kept = kept * (wanted < T)[..., None].to(old.dtype)  # nothing past the stream
    runs = torch.cat([runs.new_zeros(batch, keep, e), runs, runs.new_zeros(batch, keep_last, e)], 1)
    in_runs = full & (k >= keep) & ~tail  # [batch, K]
    return torch.where(in_runs[..., None], runs, kept), T[:, 0].clamp(max=K)


def place_positions(
    stored: torch.Tensor, num_places: int, keep: int = 0, keep_last: int = 0
) -> torch.Tensor:
    """Where each place of a squeeze="fill" memory lies in its stream, on the token axis: the
    mean index of the tokens `pool_by_length` averaged into it (float64 [batch, K] for
    S = `stored` [batch] tokens; the places past the stream are not read, their value is k).

        S ≤ K       place k holds token k                                   p_k = k
        S > K       places k < keep hold tokens k                           p_k = k
                    the last keep_last places the last tokens               p_k = S − K + k
                    the others equal runs of r = (S − keep − keep_last) / (K − keep − keep_last)
                    tokens                              p_k = keep + (k − keep + ½) r − ½

    A read that knows each place's position (`hf/head_read.py`, memory_positions="places")
    turns its keys by them, as a pretrained model's rotary attention turns a token's key."""
    S = stored.to(torch.float64)[:, None]  # [batch, 1]
    k = torch.arange(num_places, dtype=torch.float64, device=stored.device)  # [K]
    r = (S - keep - keep_last) / (num_places - keep - keep_last)  # tokens per merged place
    merged = keep + (k - keep + 0.5) * r - 0.5
    merged = torch.where(k >= num_places - keep_last, S - num_places + k, merged)
    return torch.where((S <= num_places) | (k < keep), k, merged)


def rank_positions(stored: torch.Tensor, num_places: int) -> torch.Tensor:
    """The memory laid out as contiguous text: place k of the F = min(S, K) filled places at the
    token index it would have if the places were the last F tokens before the window (float64
    [batch, K] for S = `stored` [batch]):

        p_k = k + max(S − K, 0)

    Equal to `place_positions` while every place holds one token (S ≤ K); once places merge,
    neighbouring places stay one position apart whatever they hold, so no place sits further
    than K tokens before the window, however long the stream (`hf/head_read.py`,
    memory_positions="ranks")."""
    k = torch.arange(num_places, dtype=torch.float64, device=stored.device)  # [K]
    return k + (stored.to(torch.float64)[:, None] - num_places).clamp(min=0)


# a place record (`LongTermState.records["places"]`, float64 [batch, K, 4]): the span of token
# indices [lo, hi) it stands for, how many tokens, their salience (−inf once merged); tokens = 0:
# empty
LO, HI, TOKENS, SALIENCE = range(4)


def salience(
    surprisal: torch.Tensor, burst: int = 3, after: int = 8, before: int = 0
) -> torch.Tensor:
    """How much token i is worth keeping whole [batch, T]: the largest mean surprisal
    −log p(x_j | x_<j) of `burst` consecutive tokens among the bursts ending at
    i − after + 1 … i + before, from `surprisal` [batch, T] (the text right after the model was
    surprised: a fact that does not follow from its context, and the words that state it; with
    `before`, the words just before the surprise too). Where the bursts reach past either end of
    `surprisal` the value is a lower bound: the largest of two such bounds over overlapping
    spans covering i's bursts is exact."""
    F = torch.nn.functional
    c = torch.cumsum(F.pad(surprisal, (burst, 0)), -1)
    trailing = (c[..., burst:] - c[..., :-burst]) / burst  # mean over the burst ending at j
    padded = F.pad(trailing[:, None], (after - 1, before), value=-torch.inf)
    return F.max_pool1d(padded, after + before, 1)[:, 0]


def pool_salient(
    old: torch.Tensor,
    records: torch.Tensor,
    stored: torch.Tensor,
    new: torch.Tensor,
    salience: torch.Tensor,
    keep: int,
    keep_last: int,
    budget: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The K places after L new tokens when `budget` places keep salient tokens whole.

    old       [batch, K, e]   the places before (their records `records` [batch, K, 4]: LO, HI,
                              TOKENS, SALIENCE; S = `stored` [batch] tokens in all)
    new       [batch, L, e]   the new tokens, tokens S … S + L − 1, `salience` [batch, L]
    →         [batch, K, e]   the places, in stream order; [batch, K, 4] their records;
              [batch]         P' = min(S + L, K) places hold the stream

    Until the stream overflows the K places each token has its own. Then the first `keep` and
    the last `keep_last` tokens keep a place each, and the `budget` most salient of the other
    tokens still whole (those kept before compete again with the new ones); every other place
    and token is merged, in stream order, into the remaining places by equal runs of tokens.
    A run that splits a place takes its tokens as spread evenly over the place's span. The
    places are ordered by the mean index of their tokens; a run's record keeps its span, read at
    its middle (`record_positions`: the same index unless a token kept whole left a gap in it)."""
    batch, K, e = old.shape
    L = new.shape[1]
    f64 = dict(device=old.device, dtype=torch.float64)
    S = stored.to(old.device, torch.float64)[:, None]  # [batch, 1]
    T = S + L
    j = torch.arange(L, **f64)
    fresh = torch.stack(
        [S + j, S + j + 1, torch.ones(batch, L, **f64), salience.to(**f64)], -1
    )  # [batch, L, 4]
    rec = torch.cat([records.to(**f64), fresh], 1)  # [batch, U = K + L, 4]
    units = torch.cat([old, new.to(old.dtype)], 1)  # [batch, U, e]
    lo, hi, n = rec[..., LO], rec[..., HI], rec[..., TOKENS]
    whole = (n == 1) & (hi - lo == 1)  # one token each
    full = T > K  # [batch, 1]
    first, last = whole & (lo < keep), whole & (lo >= T - keep_last)
    middle = whole & ~first & ~last
    # the `budget` most salient middle tokens (fewer when fewer are whole)
    score = torch.where(middle, rec[..., SALIENCE].nan_to_num(neginf=-1e300), -torch.inf)
    best = torch.zeros_like(middle)
    if budget:
        top = score.topk(min(budget, score.shape[1]), dim=1)
        best.scatter_(1, top.indices, torch.isfinite(top.values))
    kept = (n > 0) & (~full | first | last | best)  # [batch, U]
    merged = (n > 0) & ~kept
    # the runs: the merged units in stream order, R = K − kept places of r = M / R tokens each
    order = torch.where(merged, lo, torch.inf).argsort(1)  # merged first, by position
    take = lambda t: torch.gather(t, 1, order)  # noqa: E731
    w = take(torch.where(merged, n, 0.0))  # [batch, U] tokens per unit, in order
    lo_o, hi_o = take(lo), take(hi)
    R = (K - kept.sum(1, keepdim=True)).to(torch.float64)  # [batch, 1]
    ends = torch.cumsum(w, 1)
    edges = ends - w  # each unit's first token on the run axis
    M = ends[:, -1:]  # the merged tokens (the zero-width units after them start at M)
    r = M / R.clamp(min=1)
    a = torch.minimum(torch.arange(K + 1, **f64) * r, M)  # run boundaries [batch, K + 1]
    # the merged unit each boundary falls in (a boundary on an edge: the unit it ends)
    m = (torch.searchsorted(edges.contiguous(), a.contiguous()) - 1).clamp(0)
    at = lambda t: torch.gather(t, 1, m)  # noqa: E731
    alpha = a - at(edges)  # how far into its unit each boundary lies
    per_token = torch.where(w > 0, (hi_o - lo_o) / w.clamp(min=1e-300), 0.0)  # index per token
    step = at(per_token)
    # running integrals at each boundary: of the values, and of the token index (a unit's part
    # [0, α) holds indices lo … lo + α·step, mean lo − ½ + α·step/2)
    vals = torch.gather(units, 1, order[..., None].expand(-1, -1, e)).to(torch.float64)
    C = torch.cumsum(w[..., None] * vals, 1) - w[..., None] * vals
    Cv = torch.gather(C, 1, m[..., None].expand(-1, -1, e))
    Cv = Cv + torch.gather(vals, 1, m[..., None].expand(-1, -1, e)) * alpha[..., None]
    mean_pos = lo_o - 0.5 + (hi_o - lo_o) / 2  # a whole unit's mean index
    Cp = torch.cumsum(w * mean_pos, 1) - w * mean_pos
    Cp = at(Cp) + alpha * (at(lo_o) - 0.5) + step * alpha**2 / 2
    # the token index at each boundary: where a run ends, in the unit it ends (above); where one
    # starts, in the unit it starts (past a gap a place kept whole left in the stream)
    end = at(lo_o) + alpha * step
    # (a boundary that rounding puts a hair before a unit's first token starts in that unit)
    nudged = (a + 1e-9 * r.clamp(min=1)).contiguous()
    m = (torch.searchsorted(edges.contiguous(), nudged, right=True) - 1).clamp(0)
    start = at(lo_o) + (a - at(edges)) * at(per_token)
    run_vals = (Cv[:, 1:] - Cv[:, :-1]) / r[..., None].clamp(min=1e-300)  # [batch, K, e]
    run_pos = (Cp[:, 1:] - Cp[:, :-1]) / r.clamp(min=1e-300)
    k = torch.arange(K, device=old.device)
    is_run = (k < R) & (M > 0)  # [batch, K]
    run_rec = torch.stack(
        [start[:, :-1], end[:, 1:], r.expand(-1, K), torch.full_like(run_pos, -torch.inf)], -1
    )
    # every candidate place: the units kept whole (or unmerged), then the runs; sorted by
    # position, the K first valid ones are the places
    pos = torch.cat(
        [
            torch.where(kept, lo - 0.5 + (hi - lo) / 2, torch.inf),
            torch.where(is_run, run_pos, torch.inf),
        ],
        1,
    )
    pick = pos.argsort(1)[:, :K]  # [batch, K]
    valid = torch.gather(torch.isfinite(pos), 1, pick)
    cand_vals = torch.cat([units.to(torch.float64), run_vals], 1)
    cand_rec = torch.cat([rec, run_rec], 1)
    places = torch.gather(cand_vals, 1, pick[..., None].expand(-1, -1, e))
    out_rec = torch.gather(cand_rec, 1, pick[..., None].expand(-1, -1, 4))
    places = torch.where(valid[..., None], places, 0.0).to(old.dtype)
    out_rec = torch.where(valid[..., None], out_rec, 0.0)
    return places, out_rec, T[:, 0].clamp(max=K).to(torch.int64)


def record_positions(records: torch.Tensor) -> torch.Tensor:
    """The mean token index of each place from its record [batch, K, 4] → float64 [batch, K]
    (an empty place: its index k, as `place_positions` has it)."""
    lo, hi = records[..., LO], records[..., HI]
    k = torch.arange(records.shape[1], dtype=torch.float64, device=records.device)
    return torch.where(records[..., TOKENS] > 0, lo - 0.5 + (hi - lo) / 2, k)


def initial_records(batch: int, K: int, device=None) -> torch.Tensor:
    """The records of an empty memory: no place holds anything  [batch, K, 4]."""
    return torch.zeros(batch, K, 4, dtype=torch.float64, device=device)


__all__ = [
    "initial_records",
    "place_positions",
    "rank_positions",
    "pool_by_length",
    "pool_salient",
    "record_positions",
    "salience",
]
