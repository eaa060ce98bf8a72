"""Train the ∞-former's continuous memory beside the retrieval (`inftyformer.retrieval.continuous`)
on a frozen base: the memory's weights only, on pg19-mini's train books (held out from
book_perplexity.py's test and valid books).

Each step streams a new excerpt of `--doc-tokens` tokens from two random train books (batch 2)
through `RetrievalLM(base, preset="retrieval", memory=ContinuousConfig())` in calls of 256
tokens: the first calls are read without gradient (until the window has let go of one block
past the sink, the memory is empty or nearly, its read 0 or nearly), each later call is one
optimiser step on its loss (the base's NLL plus the reads' variance KL, as the paper trains),
the state carried to the next call detached. With `--contrast W` each call is also read with the
two rows' memories swapped (each book reading the other's, the page's `hybrid-other` control)
and the loss gains W · max(0, NLL_own − NLL_other + `--margin`): a correction that any book's
memory carries earns nothing there, only what the book's own memory holds does. With
`--lora-rank R` low-rank adapters on the base's query and value projections (`_lora.py`) train
beside the memory, at the memory's rate: a correction that lowers every book's loss has a place
of its own, and book_perplexity.py's `hybrid-empty` row (the same weights, the memory empty)
tells it from what the memory adds. `--set KEY=VALUE` (repeatable) changes the retrieval the
memory is trained beside, as `inftyformer ask --set` does: `--set choice=none --set window=448`
is the sink and a 448-token window only, the short reach the paper's memory sat beside (its
rows in book_perplexity.py read the same settings back from the weights).

    python experiments/train_hybrid_memory.py --out runs/hybrid --minutes 40   # resumable
    python experiments/book_perplexity.py --rows window,retrieval,hybrid,hybrid-other \\
        --memory-weights runs/hybrid/memory.safetensors --out docs/results/hybrid

OUT/memory.safetensors holds the memory's weights (what book_perplexity.py reads; with
--lora-rank the adapters' beside it, OUT/lora.safetensors), OUT/train.pt
the optimiser, the step and the random state (a run resumes where it stopped), OUT/train.csv the
loss of every step. Both are written whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
from _lora import TARGETS, lora_of

from inftyformer._files import atomic_path
from inftyformer._measure import command_line, default_base_model
from inftyformer.data import resolve_data_dir

SEGMENT = 256


def train_books(data_dir: Path, tokenizer) -> list[list[int]]:
    files = sorted((data_dir / "pg19-mini" / "train").glob("*.txt"))
    return [tokenizer.encode(p.read_text(encoding="utf-8")).ids for p in files]


def build(base_dir: str, settings: dict):
    from transformers import AutoModelForCausalLM

    from inftyformer.extensions.densities import NormalizedDensity
    from inftyformer.retrieval.continuous import HYBRID_LONG_TERM, ContinuousConfig
    from inftyformer.retrieval.model import RetrievalLM

    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    base.requires_grad_(False)
    long_term = HYBRID_LONG_TERM  # σ started at sigma_init when given (else softplus(0))
    if settings.get("sigma_init"):
        long_term = replace(long_term, density=NormalizedDensity(settings["sigma_init"]))
    layers = tuple(settings["layers"]) if settings["layers"] else None
    on_top = settings.get("retrieval", {})  # --set: the retrieval beside the memory
    return RetrievalLM(
        base, preset="retrieval", memory=ContinuousConfig(long_term, layers), **on_top
    )


def save(out: Path, model, optimiser, step: int, rng: random.Random, settings: dict,
         lora=None) -> None:  # fmt: skip
    from safetensors.torch import save_file

    parts = {"memory": model.memory} if lora is None else {"memory": model.memory, "lora": lora}
    for name, module in parts.items():
        weights = {k: v.detach().contiguous() for k, v in module.state_dict().items()}
        with atomic_path(out / f"{name}.safetensors") as tmp:
            save_file(weights, str(tmp), metadata={"settings": json.dumps(settings)})
    with atomic_path(out / "train.pt") as tmp:
        torch.save({"optimiser": optimiser.state_dict(), "step": step, "rng": rng.getstate(),
                    "torch_rng": torch.get_rng_state(), "settings": settings}, tmp)  # fmt: skip


def excerpt(books: list[list[int]], rng: random.Random, length: int) -> list[int]:
    long = [b for b in books if len(b) > length]
    book = long[rng.randrange(len(long))]
    start = rng.randrange(len(book) - length)
    return book[start : start + length]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-model", default=None)
    p.add_argument("--data-dir", default=None, help="holds pg19-mini/ (default: the shared data)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=40.0, help="of training, this run")
    for name, kind, default in (("--doc-tokens", int, 4096), ("--lr", float, 1e-3),
                                ("--kl-weight", float, 1e-6), ("--threads", int, 1),
                                ("--seed", int, 0), ("--sigma-init", float, 0.0),
                                ("--density-lr", float, 0.0), ("--contrast", float, 0.0),
                                ("--margin", float, 0.01), ("--lora-rank", int, 0),
                                ("--lora-alpha", float, 16.0)):  # fmt: skip
        p.add_argument(name, type=kind, default=default)
    p.add_argument("--layers", default="", help="memory blocks, a,b,… (default: the config's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a retrieval setting on the default preset (repeatable)")  # fmt: skip
    args = p.parse_args(argv)
    from tokenizers import Tokenizer

    from inftyformer.commands.ask import parse_settings
    from inftyformer.retrieval.config import RetrievalConfig

    torch.set_num_threads(args.threads)
    base_dir = args.base_model or default_base_model()
    layers = [int(x) for x in args.layers.split(",") if x]
    settings = {"base_model": Path(base_dir).name, "doc_tokens": args.doc_tokens, "lr": args.lr,
                "kl_weight": args.kl_weight, "layers": layers, "seed": args.seed,
                "sigma_init": args.sigma_init, "density_lr": args.density_lr,
                "preset": "retrieval", "command": command_line()}  # fmt: skip
    if args.contrast:  # (absent when off: runs made before it resume)
        settings.update(contrast=args.contrast, margin=args.margin)
    if args.set:  # (absent when off, as contrast); checked before the base loads
        on_top = parse_settings(args.set)
        RetrievalConfig.of("retrieval", **on_top)
        settings["retrieval"] = on_top
    if args.lora_rank:  # (absent when off, as contrast)
        settings.update(lora_rank=args.lora_rank, lora_alpha=args.lora_alpha,
                        lora_targets=list(TARGETS))  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    model = build(base_dir, settings)
    lora = lora_of(model.base, settings, args.seed)
    # the density heads w_μ, w_σ at their own rate when given (they barely move at the memory's)
    named = list(model.memory.named_parameters())
    heads = [p for n, p in named if "mu_head" in n or "sigma_head" in n]
    rest = [p for n, p in named if not ("mu_head" in n or "sigma_head" in n)]
    groups = [{"params": rest}, {"params": heads, "lr": args.density_lr or args.lr}]
    if lora is not None:
        groups.append({"params": list(lora.parameters())})
    trained = [p for g in groups for p in g["params"]]
    optimiser = torch.optim.AdamW(groups, lr=args.lr, weight_decay=0.0)
    rng, step = random.Random(args.seed), 0
    torch.manual_seed(args.seed)
    if (args.out / "train.pt").is_file():  # resume where the last run stopped
        from safetensors.torch import load_file

        saved = torch.load(args.out / "train.pt", weights_only=False)
        if {**saved["settings"], "command": ""} != {**settings, "command": ""}:
            raise SystemExit(f"{args.out} was trained with other settings: {saved['settings']}")
        model.memory.load_state_dict(load_file(str(args.out / "memory.safetensors")))
        if lora is not None:
            lora.load_state_dict(load_file(str(args.out / "lora.safetensors")))
        optimiser.load_state_dict(saved["optimiser"])
        step = saved["step"]
        rng.setstate(saved["rng"])
        torch.set_rng_state(saved["torch_rng"])
        print(f"resumed at step {step}")
    data = resolve_data_dir(args.data_dir)
    books = train_books(data, Tokenizer.from_file(str(Path(base_dir) / "tokenizer.json")))
    c = model.config
    empty_calls = -(-(c.window + c.block_size * (c.sink_blocks + 1)) // SEGMENT)  # (module doc)
    log = open(args.out / "train.csv", "a", newline="")
    writer = csv.writer(log)
    if step == 0:
        other = ["other_lm_loss"] if args.contrast else []
        writer.writerow(["step", "position", "lm_loss", "kl", "seconds", *other])
    until = time.monotonic() + 60 * args.minutes
    while time.monotonic() < until:
        ids = torch.tensor([excerpt(books, rng, args.doc_tokens + 1) for _ in range(2)])
        with torch.no_grad():
            warm = empty_calls * SEGMENT
            state = model(ids[:, :warm], logits_to_keep=1).state
        for start in range(warm, args.doc_tokens, SEGMENT):
            tic = time.perf_counter()
            chunk, target = ids[:, start : start + SEGMENT], ids[:, start + 1 : start + 1 + SEGMENT]
            out = model(chunk, state, targets=target)
            loss = out.lm_loss + args.kl_weight * out.aux["kl"]
            other = []
            if args.contrast:  # each row reads the other book's memory (module doc)
                swap = torch.tensor([1, 0])
                mixed = replace(state, continuous=state.continuous.select_rows(swap))
                them = model(chunk, mixed, targets=target).lm_loss
                loss = loss + args.contrast * torch.relu(out.lm_loss - them + args.margin)
                other = [f"{float(them.detach()):.5f}"]
            optimiser.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimiser.step()
            state, step = out.state, step + 1
            kl, seconds = float(out.aux["kl"].detach()), time.perf_counter() - tic
            writer.writerow([step, start, f"{float(out.lm_loss.detach()):.5f}", f"{kl:.3f}",
                             f"{seconds:.2f}", *other])  # fmt: skip
        state.store.close()
        log.flush()
        save(args.out, model, optimiser, step, rng, settings, lora)
        print(f"step {step}: last loss {float(out.lm_loss.detach()):.4f}", flush=True)
    log.close()


if __name__ == "__main__":
    main()
