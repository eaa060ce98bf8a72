"""Retrieval on the pretrained path, side by side: pass keys in held-out books, and the loss on
test books by position, for the base model and its memory variants on the same prompts.

Rows (every one reads the same token streams):
    window        the base alone, each block of C tokens with the W tokens before it as context
    window-2048   the base alone with a 2,048-token window (what the memory rows keep exact)
    full          the base alone on the whole prompt (its last `positions` tokens: SmolLM2 8,192)
    untrained     the memory model at initialisation (equals `window`: the read starts at zero)
    lm            memory trained on plain language modelling (--lm-run)
    facts         memory trained on facts with read supervision (--facts-run)
    facts-sticky  the facts run read with sticky memories
    facts-start   memory trained on facts, every answer query pointed at the key's first token
                  (--facts-start-run: the first recipe, kept as an ablation)
    content       as facts, with density = content: the read's place from a softmax over the
                  basis keys (--content-run)
    content-f6    as content with a σ² floor of 1e-6 (--content-f6-run)
    content-n2048 as content with N = 2,048 (widths halved twice) and a σ² floor of 1e-6
                  (--content-n2048-run)
    heads         untrained: every block's own attention heads read the memory and merge it by
                  attention mass (memory_read = heads, `inftyformer.hf.head_read`), with
                  --heads-sharpness and --heads-sink-edge
    heads-facts   the heads read trained on facts, answer loss only (--heads-facts-run)
    mixture       as heads, with density = mixture: each head reads the discrete attention
                  over the basis centres itself (β = 1), not a Gaussian at its moments
    mixture-n2048 as mixture with N = 2,048 (widths halved twice)
    mixture-length as mixture-n2048 with squeeze = by_length (every stored token an equal
                  share of the signal, up to τ = 0.95)
    mixture-fill  as mixture with squeeze = fill: one token per centre (N = 2,048 at one width
                  0.0003, below the spacing) until the memory is full, then equal runs of
                  tokens merged per centre
    mixture-fill-sink  as mixture-fill with sink edge 0: the memory's first tokens are read too
    mixture-fill-keep  as mixture-fill-sink with keep_first = 64: the first 64 tokens keep
                  their own centres when the memory merges the rest
    mixture-fill-positions  as mixture-fill-keep, every place read at its own stream position
                  (memory_positions = places: rotary bases)
    mixture-fill-recent  as mixture-fill-positions with keep_last = 1,024: the most recent
                  1,024 tokens of the memory one per place, only the older ones merged
    mixture-fill-salient  as mixture-fill-recent, 256 places kept for salient tokens (keep_salient)
    mixture-fill-ranks  as mixture-fill-salient, every place at its rank (memory_positions =
                  ranks: the places read as the last K tokens before the window)
    mixture-fill-ranks-salient  as mixture-fill-ranks with keep_salient = 959: every middle place
                  but one holds a salient token (the rest of the older past merged into one)
    mixture-fill-ranks-before  as mixture-fill-ranks-salient with salient_before = 2: the two
                  tokens before a burst of surprise are salient too (the words that open a fact)
    exact         the ceiling of the heads read: as mixture, but the heads read the exact states
                  the memory was given, one place per token (a growing cache, not a memory of
                  fixed size: `_passkey_exact.py`); prompts over 8,192 tokens are not run
    exact-positions  as exact, every stored state at its own stream position (rotary bases)

Pass keys: the facts task's evaluation facts (`inftyformer.tasks.facts`: "The pass key is
NNNNN…", five digits, never trained) written into the corpus's test books d tokens before the
question; exact = every answer token is the argmax (what greedy decoding would write), plus the
answer's NLL per token (the digit prior is ln 10 ≈ 2.30). For the trained memory rows, where
the answer's reads land: μ and σ mapped back to stream positions, per memory layer.

Books: --docs windows of --doc-len tokens of the test books; NLL per position, bucketed, and
the share of the window → full gap each row closes at positions ≥ 1K.

    python experiments/passkey.py --facts-run runs/facts-token/last --lm-run runs/lm-plain \
        --facts-start-run runs/facts-read/last --memory-layers "[15, 19, 23, 27]"
    python experiments/passkey.py ... --rows window,full     # some rows; the others are kept
    python experiments/passkey.py --quick                    # a tiny random model, seconds
    python experiments/passkey.py --render-only

Each row is written to OUT/passkey.rows/ROW.json as it finishes (two invocations with different
--rows may run at once); OUT/passkey.json gathers them and OUT/passkey.md is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import experiment as ex
from _passkey_report import NAME, READ_ROWS, ROWS, gather, render
from _passkey_rows import EXACT, EXACT_MAX_TOKENS, HEADS, MIXTURE, WIDE_WINDOW

EDGES = (0, 256, 512, 1024, 2048, 4096, 8192)


# ----------------------------------------------------------------------------- the models
class Row:
    """One row's model: `block_logits(ids, ctx)` scores the last block of each stream."""

    def __init__(self, name: str, args: argparse.Namespace, overrides: dict | None = None) -> None:
        """`overrides`: adapter settings over an untrained memory row's own."""
        import torch
        from transformers import AutoModelForCausalLM

        from inftyformer.model_kinds import PretrainedMemoryConfig, build_model
        from inftyformer.training import load_run

        self.name, self.args, self.memory, self.run = name, args, None, None
        if name in ("window", "window-2048", "full"):
            self.base = AutoModelForCausalLM.from_pretrained(args.base_model, dtype=torch.float32)
            self.base.eval()
            self.positions = int(self.base.config.max_position_embeddings)
            return
        settings = {"window": args.window, "segment_len": args.segment_len}
        if name in ("untrained", "heads", *EXACT, *MIXTURE):
            torch.manual_seed(0)
            layers = json.loads(args.memory_layers) if args.memory_layers else None
            if name == "heads":  # every block, the base's own heads (no weights trained)
                layers = None
                settings.update(HEADS, sharpness=args.heads_sharpness)
                settings["sink_edge"] = args.heads_sink_edge
            if name in (*MIXTURE, *EXACT):
                layers = None
                settings.update({"sink_edge": args.heads_sink_edge,
                                 **MIXTURE.get(name, MIXTURE["mixture"])})  # fmt: skip
            settings.update(overrides or {})
            config = PretrainedMemoryConfig(
                base_model=args.base_model, memory_layers=layers, freeze_base=True, **settings
            )
            self.memory = build_model(config).eval()
            if name in EXACT:
                from _passkey_exact import read_exact_states

                read_exact_states(self.memory, positions=name == "exact-positions")
        else:
            option = name.removesuffix("-sticky")
            self.run = getattr(args, option.replace("-", "_") + "_run")
            if self.run is None:
                raise SystemExit(f"row {name} needs --{option}-run RUN_DIR")
            if name.endswith("sticky"):
                settings["sticky"] = True
            self.memory = load_run(self.run, memory_settings=settings).model
        self.config = self.memory.config

    def stream(self, ids, record: bool = False, last_only: bool = False):
        """ids [B, S] (S a multiple of C) → the (start, logits) pieces of the stream: the
        memory rows run block by block, `window` each block with the W tokens before it,
        `full` one pass over the last `positions` tokens; with `last_only` only the last block's
        logits are kept (and computed, where nothing before it matters). Also the last block's
        reads when `record`."""
        import torch

        from inftyformer.core.attention import record_reads

        C, W = self.args.segment_len, self.args.window
        W = WIDE_WINDOW if self.name == "window-2048" else W
        S = ids.shape[1]
        if self.name == "full":
            start = max(0, S - self.positions)  # positions before `start`: unseen
            keep = C if last_only else 0
            logits = torch.cat(
                [
                    self.base(ids[i : i + 1, start:], logits_to_keep=keep).logits
                    for i in range(ids.shape[0])
                ]
            )  # one row at a time: P² scores
            return [(S - logits.shape[1], logits)], None
        pieces, state, reads = [], None, None
        if self.memory is not None:
            state = self.memory.init_state(ids.shape[0])
        for a in range(0, S, C):
            b = min(a + C, S)
            if self.memory is None:
                if last_only and b < S:
                    continue
                ctx = max(0, a - W)
                logits = self.base(ids[:, ctx:b]).logits[:, a - ctx :]
            elif record and b == S:
                with record_reads(self.memory) as reads:
                    out = self.memory(ids[:, a:b], state=state)
                logits, state = out.logits, out.state
            else:
                out = self.memory(ids[:, a:b], state=state)
                logits, state = out.logits, out.state
            if not last_only or b == S:
                pieces.append((a, logits))
        return pieces, reads


def _nll(pieces, targets):
    """Per-position NLL [B, S] (NaN where no logits or the target is ignored) from the
    (start, logits) pieces of a stream; targets [B, S] aligned (position t predicts t + 1)."""
    import torch

    from inftyformer.native.model import IGNORE_INDEX, token_losses

    nll = torch.full(targets.shape, math.nan, dtype=torch.float64)
    hit = torch.zeros(targets.shape, dtype=torch.bool)
    for start, logits in pieces:
        t = targets[:, start : start + logits.shape[1]]
        values, _ = token_losses(logits, t)
        nll[:, start : start + t.shape[1]] = torch.where(
            t != IGNORE_INDEX, values.double(), math.nan
        )
        hit[:, start : start + t.shape[1]] = logits.argmax(-1) == t
    return nll, hit


# ----------------------------------------------------------------------------- pass keys
def passkey_prompts(args: argparse.Namespace) -> dict[int, tuple]:
    """d → (inputs [K, S], answer targets [K, S], key_at [K]): the facts task's test facts."""
    from inftyformer.data import load_split, load_tokenizer, resolve_data_dir
    from inftyformer.tasks.facts import FactsConfig, FactsDataset

    tokenizer = load_tokenizer(args.base_model)
    books = load_split(resolve_data_dir(args.data_dir), "test", tokenizer)
    out = {}
    for i, d in enumerate(args.distances):
        config = FactsConfig(data_dir=args.data_dir, tokenizer=args.base_model, distance=(d,))
        data = FactsDataset(config, tokenizer, books, args.keys, args.segment_len, "test", 7)
        inputs, answer, _, _, key_at = data.batch(i, distance=d)
        out[d] = (inputs, answer, key_at)
    return out


def where_reads_land(row: Row, reads, answer, key_at) -> list[dict[str, float]]:
    """Per memory layer, over keys, heads and the answer's queries (the one predicting answer
    token j against key token j): how far μ lies from that token in stream tokens, σ in
    tokens there, and the share of reads with |μ − t*| < σ; and the head whose median
    distance is smallest (a pretrained model's retrieval heads, for the heads row)."""
    from inftyformer.native.model import IGNORE_INDEX
    from inftyformer.tasks.facts import (
        read_positions,
        read_targets,
        stream_positions,
        tokens_per_unit,
    )

    C, W, tau = row.args.segment_len, row.args.window, row.config.tau
    S = answer.shape[1]
    scored = answer[:, -C:] != IGNORE_INDEX  # [K, C]
    target = read_positions(scored, key_at, per_token=True)  # [K, C]
    t, known = (x.view_as(target) for x in read_targets(target.flatten(), S, C, W, tau))
    per_token = tokens_per_unit(target.flatten(), S, C, W, tau).view_as(target)
    mask = (scored & known)[:, None, :]  # [K, 1, C]
    out = []
    for layer in reads:
        read = layer[-1]
        mu, var = read.mu[..., -C:].double(), read.sigma_sq[..., -C:].double()  # [K, H, C]
        m = mask.expand_as(mu)
        if not bool(m.any()):
            out.append({})
            continue
        pos = stream_positions(mu, S, C, W, tau)
        far = (pos - target[:, None, :].double()).abs()  # [K, H, C]
        dist = far[m]
        sigma = var.sqrt()
        within = ((mu - t[:, None, :]).abs() < sigma)[m]
        per_head = [float(far[:, h][m[:, h]].median()) for h in range(far.shape[1])]
        best = min(range(len(per_head)), key=per_head.__getitem__)
        out.append({
            "distance_tokens": float(dist.median()),
            "sigma_tokens": float((sigma * per_token[:, None, :])[m].median()),
            "sigma": float(sigma[m].median()),
            "within_sigma": float(within.double().mean()),
            "best_head": best,
            "best_head_distance_tokens": per_head[best],
        })  # fmt: skip
    return out


def evaluate_passkeys(row: Row, prompts: dict[int, tuple]) -> dict[str, Any]:
    import torch

    from inftyformer.native.model import IGNORE_INDEX

    out = {}
    with torch.no_grad():
        for d, (inputs, answer, key_at) in prompts.items():
            if row.name in EXACT and inputs.shape[1] > EXACT_MAX_TOKENS:
                continue
            limit = getattr(row.args, "max_prompt_tokens", None)
            if limit and (inputs.shape[1] > limit) != bool(getattr(row.args, "part", None)):
                continue  # over the limit; a part (--part): not over it
            part_limit = getattr(row.args, "part_max_tokens", None)
            if part_limit and inputs.shape[1] > part_limit:
                continue
            record = row.name in READ_ROWS
            pieces, reads = row.stream(inputs, record=record, last_only=True)
            nll, hit = _nll(pieces, answer)
            scored = answer != IGNORE_INDEX
            exact = (hit | ~scored).all(-1)
            out[str(d)] = {
                "exact": float(exact.double().mean()),
                "nll": float(nll[scored].mean()),
                "keys": int(inputs.shape[0]),
                "tokens": int(inputs.shape[1]),
                # per key: how many of its answer tokens are the argmax, of how many
                "right": (hit & scored).sum(-1).tolist(),
                "answer_tokens": scored.sum(-1).tolist(),
            }
            # where the reads land, for a memory whose places follow from a fixed τ
            if reads is not None and row.config.long_term.squeeze.kind == "fixed":
                out[str(d)]["reads"] = where_reads_land(row, reads, answer, key_at)
            print(f"  {row.name} d={d}: exact {out[str(d)]['exact']:.2f}, "
                  f"nll {out[str(d)]['nll']:.3f}", flush=True)  # fmt: skip
    return out


# ----------------------------------------------------------------------------- books
def book_windows(args: argparse.Namespace):
    """[docs, doc_len] token windows of the test books, spread evenly over them."""
    import numpy as np
    import torch

    from inftyformer.data import load_split, load_tokenizer, resolve_data_dir

    tokenizer = load_tokenizer(args.base_model)
    books = load_split(resolve_data_dir(args.data_dir), "test", tokenizer)
    tokens = np.asarray(books.tokens, dtype=np.int64)
    offsets, windows = np.asarray(books.doc_offsets), []
    per_book = -(-args.docs // (len(offsets) - 1))
    for b in range(len(offsets) - 1):
        start, stop = int(offsets[b]), int(offsets[b + 1])
        room = stop - start - args.doc_len
        for j in range(per_book if room >= 0 else 0):
            at = start + (room * (j + 1)) // (per_book + 1)
            windows.append(tokens[at : at + args.doc_len])
    if not windows:
        raise SystemExit(f"no test book holds {args.doc_len} tokens")
    return torch.from_numpy(np.stack(windows[: args.docs]))


def evaluate_books(row: Row, docs) -> dict[str, Any]:
    import torch

    targets = torch.full_like(docs, -100)
    targets[:, :-1] = docs[:, 1:]
    with torch.no_grad():
        start = time.process_time()
        nlls = [
            _nll(row.stream(docs[i : i + 1])[0], targets[i : i + 1])[0] for i in range(len(docs))
        ]
        cpu = time.process_time() - start
    nll = torch.cat(nlls)  # [docs, T]
    buckets = {}
    for lo, hi in zip(EDGES, EDGES[1:], strict=False):
        part = nll[:, lo:hi]
        part = part[~part.isnan()]
        if part.numel():
            buckets[f"{lo}-{hi}"] = float(part.mean())
    tail = nll[:, 1024:]
    return {
        "buckets": buckets,
        "from_1k": float(tail[~tail.isnan()].mean()) if docs.shape[1] > 1024 else None,
        "cpu_per_token_ms": 1000 * cpu / docs.numel(),
        "per_position": nll.nanmean(0).tolist()[:: max(1, docs.shape[1] // 256)],
    }


def add_prompt_arguments(p: argparse.ArgumentParser, distances: str, keys: int) -> None:
    """What `passkey_prompts` reads (the base, the books, distances, keys per distance, blocks
    and window) and the report's options."""
    p.add_argument("--base-model", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--distances", default=distances)
    p.add_argument("--keys", type=int, default=keys)
    p.add_argument("--segment-len", type=int, default=256)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--out", type=Path)


def prompt_setup(
    args: argparse.Namespace, quick: dict[str, Any], extra: tuple[str, ...]
) -> tuple[Path, dict[str, Any]]:
    """One torch thread; with --quick (and not --render-only) a tiny random model, books of one
    repeated sentence and the `quick` settings; the default base; distances parsed. Returns the
    output folder and the setup a report is kept under: the prompt settings, `extra` and the
    base's name."""
    import torch

    torch.set_num_threads(1)
    out_dir = args.out or (Path(tempfile.mkdtemp()) if args.quick else ex.ROOT / "docs" / "results")
    if args.quick and not args.render_only:
        args.base_model = str(ex.tiny_model_writer()(Path(tempfile.mkdtemp()) / "base"))
        args.data_dir = str(_quick_books(Path(tempfile.mkdtemp())))
        for name, value in quick.items():
            setattr(args, name, value)
    args.base_model = args.base_model or ex.default_base_model()
    args.distances = [int(d) for d in str(args.distances).split(",")]
    names = ("distances", "keys", "segment_len", "window", *extra)
    setup = {k: getattr(args, k) for k in names}
    setup["base_model"] = Path(args.base_model).name
    return out_dir, setup


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_prompt_arguments(p, distances="300,700,1500,4000,12000", keys=5)
    p.add_argument("--facts-run", default=None)
    p.add_argument("--lm-run", default=None)
    p.add_argument("--facts-start-run", default=None)
    p.add_argument("--content-run", default=None)
    p.add_argument("--content-f6-run", default=None)
    p.add_argument("--content-n2048-run", default=None)
    p.add_argument("--memory-layers", default=None,
                   help="the untrained row's blocks, a JSON list (default: every block); "
                        "give the trained rows' to compare like with like")  # fmt: skip
    p.add_argument("--heads-facts-run", default=None)
    p.add_argument("--heads-sharpness", type=float, default=100.0)
    p.add_argument("--heads-sink-edge", type=float, default=0.01)
    p.add_argument("--docs", type=int, default=4)
    p.add_argument("--doc-len", type=int, default=4096)
    p.add_argument("--rows", default=None, help="default: every row (--quick: a few)")
    p.add_argument("--max-prompt-tokens", type=int, default=None,
                   help="run no prompt longer than this (–): to fit a row into a time budget; "
                        "the row records it")  # fmt: skip
    p.add_argument(
        "--part-max-tokens",
        type=int,
        default=None,
        help="with --part: no prompt longer than this either",
    )
    p.add_argument("--part", default=None,
                   help="measure the prompts over --max-prompt-tokens of each row only (no books), "
                        "into ROW@PART.json: the report adds them to the row (a long row split "
                        "over two runs)")  # fmt: skip
    args = p.parse_args(argv)
    if args.part and not args.max_prompt_tokens:
        p.error("--part measures the prompts over --max-prompt-tokens: give both")
    quick = dict(distances="40,90", keys=2, segment_len=16, window=16, docs=2, doc_len=48)
    out_dir, setup = prompt_setup(args, quick, extra=("docs", "doc_len"))
    if args.rows is None:
        quick_rows = "window,full,untrained,heads,mixture,exact,exact-positions"
        args.rows = quick_rows if args.quick else ",".join(ROWS)
    if not args.render_only:
        prompts, docs = passkey_prompts(args), book_windows(args)
        (out_dir / f"{NAME}.rows").mkdir(parents=True, exist_ok=True)
        for name in [r.strip() for r in args.rows.split(",") if r.strip()]:
            if name not in ROWS:
                raise SystemExit(f"unknown row {name!r}; rows: {', '.join(ROWS)}")
            start = time.perf_counter()
            row = Row(name, args)
            entry: dict[str, Any] = {"run": row.run, "passkey": evaluate_passkeys(row, prompts)}
            entry["books"] = None if args.part else evaluate_books(row, docs)
            if name == "full":
                entry["positions"] = row.positions
            if row.memory is not None:
                entry["memory_layers"] = row.config.memory_layers
            if name == "heads":
                entry["settings"] = {**HEADS, "sharpness": args.heads_sharpness,
                                     "sink_edge": args.heads_sink_edge}  # fmt: skip
            if name in MIXTURE:
                entry["settings"] = {"sink_edge": args.heads_sink_edge, **MIXTURE[name]}
            if args.max_prompt_tokens:
                key = "min_prompt_tokens" if args.part else "max_prompt_tokens"
                entry[key] = args.max_prompt_tokens + (1 if args.part else 0)
            if args.part and args.part_max_tokens:
                entry["max_prompt_tokens"] = args.part_max_tokens
            entry["seconds"] = time.perf_counter() - start
            stem = f"{name}@{args.part}" if args.part else name
            path = out_dir / f"{NAME}.rows" / f"{stem}.json"
            path.write_text(json.dumps({"setup": setup, "row": entry}, indent=1) + "\n")
            print(f"{name}: {entry['seconds'] / 60:.1f} min", flush=True)
    data = (
        gather(out_dir, setup) if not args.render_only else ex.load_report(out_dir / f"{NAME}.json")
    )
    if not args.render_only:
        ex.write_report(out_dir / f"{NAME}.json", data)
    render(data, out_dir)
    print(f"wrote {out_dir / NAME}.md")


def _quick_books(root: Path) -> Path:
    text = "It was a bright cold day in April, and the clocks were striking thirteen. " * 30
    for split in ("train", "valid", "test"):
        (root / "pg19-mini" / split).mkdir(parents=True)
        for i in range(2):
            (root / "pg19-mini" / split / f"{i}.txt").write_text(f"{split} {i}. " + text)
    return root


if __name__ == "__main__":
    main()
