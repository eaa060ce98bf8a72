"""A write that keeps what surprised the model: row (xix) with B of its places kept for single
tokens chosen by the base's surprisal. The exploratory probe that came before the library's
`keep_salient` (row xx of passkey.py), kept as its loop-by-loop reference: it stands in for the
memory's pooling, with the salience of a separate windowed pass of the base.

    python experiments/passkey_salient.py --distances 4000 --keys 3 --budget 256
    python experiments/passkey_salient.py --distances 4000 --keys 3 --budget 0    # row (xix)
    python experiments/passkey_salient.py --docs 2 --doc-len 4096 --distances 300 --keys 1

Row (xix) (`passkey.py`: a fill memory of K = 2,048 places, the first 64 and the last 1,024
tokens one per place, every place at its own stream position) merges the tokens between the
kept ones in equal runs, so a pass key read d ≥ 4,000 tokens ago shares its places with its
neighbours and is lost. Here, at every update, B more places each keep one token: the B most
salient of the tokens between the kept ones (those kept before compete again), and only the
others are merged, in equal runs of tokens by position. A place's position is the mean index of
the tokens merged into it (a run that splits an older place takes that place's tokens as spread
evenly over its span), the places sorted by position.

Salience of token i: `places.salience` (the largest mean surprisal of `burst` consecutive
tokens among those ending at i − after + 1 … i), the surprisal −log p(x_j | x_<j) from the base
with the same window as the memory row (W tokens before each block): what a model streaming the
text knows when the token is written, less its memory (row xx uses the memory model's own).

With B = 0 the places are the library's `pool_by_length`, with B > 0 its `pool_salient`'s (the
tests check both, values to float64 rounding). One Python loop per place: slow past a few
thousand tokens. Prints one JSON line per distance (and for the books), appended to --jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from contextlib import contextmanager

from passkey import (
    MIXTURE,
    Row,
    add_prompt_arguments,
    book_windows,
    evaluate_books,
    evaluate_passkeys,
    passkey_prompts,
    prompt_setup,
)

from inftyformer.extensions.places import salience

ROW = "mixture-fill-recent"  # row (xix): the memory whose pooling the probe replaces


def window_surprisal(row: Row, ids):
    """−log p(x_i | the W tokens before its block and the block's tokens before it) [B, S] (0 for
    the first token): the base with the memory row's window, block by block."""
    import torch

    out = torch.zeros(ids.shape, dtype=torch.float64)
    pieces, _ = row.stream(ids)
    for a, logits in pieces:
        target = ids[:, a + 1 : a + 1 + logits.shape[1]]
        n = target.shape[1]
        logp = torch.log_softmax(logits[:, :n].double(), -1)
        out[:, a + 1 : a + 1 + n] = -logp.gather(2, target[..., None])[..., 0]
    return out


class SalientPlaces:
    """The places of a fill memory of K places with `budget` of them kept for salient tokens,
    one plan per (stored, new) shared by every memory layer (the places depend on the stream's
    token indices and salience, not on the layer's states). Place records per row: (lo, hi,
    tokens, salience, single): the span of token indices [lo, hi) it stands for, how many."""

    def __init__(self, K: int, keep: int, keep_last: int, budget: int) -> None:
        self.K, self.keep, self.keep_last, self.budget = K, keep, keep_last, budget
        self.salience = None  # [B, S] of the stream being read
        self.reset()

    def reset(self) -> None:
        self.places: dict[int, list[list[tuple]]] = {0: []}  # stored → per row, place records
        self.plans: dict[tuple[int, int], object] = {}

    @staticmethod
    def position(lo: float, hi: float, n: float, a: float = 0.0, b: float | None = None) -> float:
        """The mean token index of the part [a, b) of a place's n tokens (spread over [lo, hi))."""
        b = n if b is None else b
        return lo + (hi - lo) * (a + b) / (2 * n) - 0.5

    def plan(self, S: int, L: int):
        """[B, K, K + L] float64: each new place as weights over [old places, new tokens]."""
        import torch

        if (S, L) in self.plans:
            return self.plans[(S, L)]
        K, T = self.K, S + L
        weights, rows = [], []
        for b in range(self.salience.shape[0]):
            old = self.places[S][b] if self.places[S] else []
            units = [(*rec, u) for u, rec in enumerate(old)]
            units += [(S + j, S + j + 1, 1.0, float(self.salience[b, S + j]), True, K + j)
                      for j in range(L)]  # fmt: skip
            W = torch.zeros(K, K + L, dtype=torch.float64)
            new = []  # (lo, hi, n, salience, single, {unit: weight}, position)
            single = lambda x: x[4] and x[2] == 1.0  # noqa: E731
            if T <= K:
                new = [(*x[:5], {x[5]: 1.0}, x[0]) for x in units]
            else:
                first = [x for x in units if single(x) and x[0] < self.keep]
                last = [x for x in units if single(x) and x[0] >= T - self.keep_last]
                middle = [x for x in units if single(x) and self.keep <= x[0] < T - self.keep_last]
                middle.sort(key=lambda x: -x[3])
                chosen = first + last + middle[: self.budget]
                ids = {x[5] for x in chosen}
                new = [(*x[:5], {x[5]: 1.0}, x[0]) for x in chosen]
                rest = sorted((x for x in units if x[5] not in ids), key=lambda x: x[0])
                R = K - len(chosen)
                r = sum(x[2] for x in rest) / R
                edges = [0.0]
                for x in rest:
                    edges.append(edges[-1] + x[2])
                for i in range(R):
                    a, z = i * r, (i + 1) * r
                    w, mean, lo, hi = {}, 0.0, math.inf, -math.inf
                    for v, x in enumerate(rest):
                        part = min(edges[v + 1], z) - max(edges[v], a)
                        if part <= 1e-12:
                            continue
                        s0 = max(edges[v], a) - edges[v]  # the part [s0, s0 + part) of its tokens
                        w[x[5]] = part / r
                        mean += part / r * self.position(x[0], x[1], x[2], s0, s0 + part)
                        step = (x[1] - x[0]) / x[2]
                        lo = min(lo, x[0] + s0 * step)
                        hi = max(hi, x[0] + (s0 + part) * step)
                    new.append((lo, hi, r, -math.inf, False, w, mean))
            new.sort(key=lambda x: x[6])
            for i, x in enumerate(new):
                for u, wt in x[5].items():
                    W[i, u] += wt
            weights.append(W)
            rows.append([(*x[:5], x[6]) for x in new])
        self.places[T] = [[rec[:5] for rec in row] for row in rows]
        self.plans[(S, L)] = (torch.stack(weights), rows)
        return self.plans[(S, L)]

    def pool(self, old, stored, new, keep=0, keep_last=0):
        """Stands in for `places.pool_by_length` (same arguments and results)."""
        import torch

        S = int(stored[0])
        if not bool((stored == S).all()):
            raise ValueError("the probe's rows must hold streams of one length")
        W, _ = self.plan(S, new.shape[1])
        V = W.to(old.dtype) @ torch.cat([old, new.to(old.dtype)], 1)
        return V, torch.full_like(stored, min(S + new.shape[1], self.K))

    def positions(self, stored, num_places, keep=0, keep_last=0):
        """Stands in for `places.place_positions`."""
        import torch

        T = int(stored[0])
        out = torch.arange(num_places, dtype=torch.float64).repeat(stored.shape[0], 1)
        for b, row in enumerate(self.places.get(T, [])):
            at = [self.position(lo, hi, n) for lo, hi, n, _, _ in row]
            out[b, : len(at)] = torch.tensor(at, dtype=torch.float64)
        return out

    def singles(self, T: int) -> list[set[int]]:
        """The token index of every place that holds one token, per row, after T tokens."""
        return [{int(lo) for lo, hi, n, _, one in row if n == 1.0 and one}
                for row in self.places.get(T, [])]  # fmt: skip


@contextmanager
def salient_pooling(places: SalientPlaces):
    """The memory's pooling and the heads read's place positions replaced by `places`'."""
    import inftyformer.extensions.squeezes as squeezes

    saved = squeezes.pool_by_length, squeezes.place_positions
    squeezes.pool_by_length, squeezes.place_positions = places.pool, places.positions
    try:
        yield
    finally:
        squeezes.pool_by_length, squeezes.place_positions = saved


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_prompt_arguments(p, distances="4000", keys=3)
    p.add_argument("--budget", type=int, default=256, help="places kept for salient tokens")
    p.add_argument("--burst", type=int, default=3)
    p.add_argument("--after", type=int, default=8)
    p.add_argument("--docs", type=int, default=0, help="test-book windows (0: none)")
    p.add_argument("--doc-len", type=int, default=4096)
    p.add_argument("--jsonl", default=None, help="append each line to this file")
    args = p.parse_args(argv)
    args.memory_layers, args.heads_sink_edge, args.heads_sharpness = None, 0.01, 100.0
    quick = dict(distances="90", keys=2, segment_len=16, window=16, docs=1, doc_len=96)
    _, setup = prompt_setup(args, quick, extra=("docs", "doc_len"))
    settings = dict(MIXTURE[ROW])
    if args.quick:  # a memory the quick prompts overflow
        settings.update(num_basis=32, widths=(0.01,), keep_first=4, keep_last=8)
        args.budget = min(args.budget, 8)
    base = Row("window", args)
    row = Row("mixture", args, overrides=settings)
    places = SalientPlaces(settings["num_basis"], settings["keep_first"], settings["keep_last"],
                           args.budget)  # fmt: skip
    common = {"probe": "salient", "budget": args.budget, "burst": args.burst, "after": args.after,
              "setup": setup}  # fmt: skip

    def write(line: dict) -> None:
        print(json.dumps(line), flush=True)
        if args.jsonl:
            with open(args.jsonl, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")

    import torch

    for d, (inputs, answer, key_at) in passkey_prompts(args).items():
        start = time.perf_counter()
        with torch.no_grad():
            places.salience = salience(window_surprisal(base, inputs), args.burst, args.after)
        places.reset()
        with salient_pooling(places):
            result = evaluate_passkeys(row, {d: (inputs, answer, key_at)})[str(d)]
        digits = (answer != -100).sum(1)  # the key's tokens per row (from key_at on)
        kept = places.singles(max(places.places))
        line = {**common, "d": d, "exact": result["exact"], "nll": result["nll"],
                "key_kept": [all(int(k) + j in s for j in range(int(n)))
                             for k, n, s in zip(key_at, digits, kept, strict=True)],
                "seconds": time.perf_counter() - start}  # fmt: skip
        write(line)
    if args.docs:
        start = time.perf_counter()
        docs = book_windows(args)
        parts = []
        for i in range(len(docs)):  # one stream at a time: its own salience
            with torch.no_grad():
                places.salience = salience(window_surprisal(base, docs[i : i + 1]),
                                           args.burst, args.after)  # fmt: skip
            places.reset()
            with salient_pooling(places):
                parts.append(evaluate_books(row, docs[i : i + 1]))
        mean = lambda xs: sum(xs) / len(xs)  # noqa: E731  (windows of one length)
        buckets = {k: mean([b["buckets"][k] for b in parts]) for k in parts[0]["buckets"]}
        from_1k = mean([b["from_1k"] for b in parts]) if parts[0]["from_1k"] else None
        books = {"buckets": buckets, "from_1k": from_1k}
        write({**common, "books": books, "seconds": time.perf_counter() - start})


if __name__ == "__main__":
    main()
