"""What retrieval costs per token, and whether its memory stays flat, against the base.

    python benchmarks/bench_retrieval.py                      # SmolLM2-135M, to 16,384 tokens
    python benchmarks/bench_retrieval.py --lengths 4096,16384,65536 --memory-lengths 65536
    python benchmarks/bench_retrieval.py --tiny               # a random tiny Llama, seconds

Writes docs/results/benchmarks/retrieval_cost.{json,md,png} (--tiny: retrieval_cost_tiny.*).

Time: one stream of book text per row, read in blocks of `--block` tokens (batch 1, the given
torch threads); the rows take turns block by block (each round in a rotated order), so the
machine's load falls on all of them alike. ms/token at a length is the median block time over the
last quarter of the blocks before it, over the block's tokens; the ratio is against `window` (the
base with a KV cache of its last 2,048 tokens) in the same rounds. Rows:

    window-256   the base with a KV cache of its last 256 tokens
    window       the base with a KV cache of its last 2,048 (the `window` preset)
    full         the base with its whole past in its KV cache (to `--full-limit` tokens)
    streaming    the `streaming` preset (first 64 + last 1,984)
    retrieval    the `retrieval` preset (first 64 + 16 chosen blocks of 64 + last 960)
    retrieval-near     a retired preset (experiments/_retired_presets.py), when --rows names it
    paper        the ∞-former's continuous memory added to the base (`paper-gpt2` preset,
                 untrained: cost only; to `--full-limit` tokens)
    hybrid       `retrieval` with the ∞-former's continuous memory of what leaves its window
                 (`inftyformer.retrieval.continuous`; untrained: cost only), when --rows names it

Memory: the window and retrieval rows (and retrieval-near when --rows names it) each stream
alone in a fresh process to the longest of `--memory-lengths`, its resident memory (VmRSS)
recorded at every length; retrieval's blocks on disk are reported beside it (bytes per token).

Generation: ms per new token of `generate` (greedy, batch 1) after a prompt of `--prompt` tokens:
the retrieval preset's (it chooses its blocks for the prompt's last call first) against the base's
own `generate` on the prompt's last 2,048 tokens, taking turns.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from inftyformer import _measure as common
from inftyformer.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))
from _retired_presets import PRESET, RETIRED  # noqa: E402  (experiments/ is not a package)

ROWS = ("window-256", "window", "full", "streaming", "retrieval", "paper")
LIMITED = ("full", "paper")  # rows read only to --full-limit tokens
# rows that are presets of the retrieval kind (`inftyformer presets`)
RETRIEVAL_KIND = tuple(p.name for p in PRESETS.values() if p.kind in ("retrieval", "baseline"))
OPTIONAL = ("hybrid", *RETIRED)  # rows measured when --rows names them
MEMORY_ROWS = ("window", "retrieval", "retrieval-near")  # each alone in a process, when in --rows


def book_ids(tokenizer_dir: str, count: int, vocab: int) -> torch.Tensor:
    """`count` token ids of the test books (repeated if short; the embedded books without
    ../shared), as [1, count]."""
    from retrieval import filler_text
    from tokenizers import Tokenizer

    data = ROOT.parent / "shared" / "data"
    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    ids = tok.encode(filler_text(data if data.is_dir() else None)).ids
    ids = (ids * (count // max(len(ids), 1) + 1))[:count]
    return torch.tensor(ids).clamp(max=vocab - 1)[None]


class Stream:
    """One row: reads its next block on `step` and keeps its state."""

    def __init__(self, row: str, base) -> None:
        from inftyformer.retrieval.model import RetrievalLM

        self.row, self.base, self.state = row, base, None
        if row == "window-256":
            self.model = RetrievalLM(base, choice="none", sink_blocks=0, window=256)
        elif row in RETRIEVAL_KIND:
            self.model = RetrievalLM(base, preset=row)
        elif row in RETIRED:
            self.model = RetrievalLM(base, preset=PRESET, **RETIRED[row])
        elif row == "hybrid":
            from inftyformer.retrieval.continuous import ContinuousConfig

            self.model = RetrievalLM(base, preset="retrieval", memory=ContinuousConfig())
        elif row == "paper":
            from inftyformer.hf import add_long_term_memory

            self.model = add_long_term_memory(base, preset="paper-gpt2").eval()
        else:
            self.model = None

    @torch.no_grad()
    def step(self, ids: torch.Tensor) -> None:
        if self.row == "full":
            out = self.base(ids, cache=self.state, use_cache=True, logits_to_keep=1)
            self.state = out.cache
        else:
            self.state = self.model(ids, state=self.state, logits_to_keep=1).state

    def close(self) -> None:
        if self.row == "paper":
            self.model.unwrap()
        store = getattr(self.state, "store", None)
        if store is not None:
            store.close()


def load_base(args):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(args.base_model, dtype=torch.float32).eval()
    return base


def time_rows(args, base) -> dict[str, Any]:
    """Every row reads the stream block by block, taking turns (module doc)."""
    lengths = sorted(args.lengths)
    ids = book_ids(args.base_model, max(lengths), int(base.config.vocab_size))
    rows = [r for r in args.rows if r != "paper"]  # paper wraps the base: alone, after
    block_ms: dict[str, list[float]] = {r: [] for r in args.rows}
    blocks = max(lengths) // args.block
    for group in (rows, [r for r in args.rows if r == "paper"]):
        streams = {r: Stream(r, base) for r in group}
        for i in range(blocks):
            chunk = ids[:, i * args.block : (i + 1) * args.block]
            live = [r for r in group if r not in LIMITED or (i + 1) * args.block <= args.full_limit]
            order = live[i % len(live) :] + live[: i % len(live)] if live else []
            for r in order:
                start = time.perf_counter()
                streams[r].step(chunk)
                block_ms[r].append(1000.0 * (time.perf_counter() - start))
            if args.progress and (i + 1) % 8 == 0:
                print(f"  {group} {(i + 1) * args.block} tokens", flush=True)
        for stream in streams.values():
            stream.close()
    per_token: dict[str, dict[str, float]] = {r: {} for r in args.rows}
    for r, times in block_ms.items():
        for n in lengths:
            done = n // args.block
            if done > len(times) or done == 0:
                continue
            tail = times[done - max(1, done // 4) : done]
            per_token[r][str(n)] = statistics.median(tail) / args.block
    return {"block_ms": block_ms, "ms_per_token": per_token}


def memory_worker(args: dict[str, Any]) -> dict[str, Any]:
    """One row alone, in its own process: VmRSS at each length, the store's disk use."""
    torch.set_num_threads(args["threads"])
    ns = argparse.Namespace(base_model=args["base_model"])
    base = load_base(ns)
    lengths = sorted(args["lengths"])
    ids = book_ids(args["base_model"], max(lengths), int(base.config.vocab_size))
    stream = Stream(args["row"], base)
    rss, block = {}, args["block"]
    for i in range(max(lengths) // block):
        stream.step(ids[:, i * block : (i + 1) * block])
        if (i + 1) * block in lengths:
            rss[str((i + 1) * block)] = common.rss_mb()
    store = getattr(stream.state, "store", None)
    disk = store.disk_bytes() if store is not None else 0
    stream.close()
    return {"rss_mb": rss, "peak_rss_mb": common.peak_rss_mb(), "disk_bytes": disk,
            "tokens": max(lengths)}  # fmt: skip


@torch.no_grad()
@torch.no_grad()
def time_generate(args, base) -> dict[str, Any]:
    """ms per new token, decoding only: the retrieval preset's generate after the prompt but
    its last token (read untimed), against the base's own generate with its KV cache of the
    prompt's last 2,048 tokens but one (filled untimed, a fresh copy before each turn)."""
    import copy

    from inftyformer.retrieval.model import RetrievalLM

    prompt = book_ids(args.base_model, args.prompt, int(base.config.vocab_size))
    model = RetrievalLM(base, preset="retrieval")
    state = model(prompt[:, :-1], logits_to_keep=1).state
    recent = prompt[:, -2048:]
    filled = base(recent[:, :-1], use_cache=True, logits_to_keep=1).cache
    new, cache = args.new_tokens, {}

    def ours():
        model.generate(prompt[:, -1:], new, 0, state=state)

    def theirs():
        mask = torch.ones_like(recent)
        base.generate(recent, attention_mask=mask, cache=cache["kv"], max_new_tokens=new,
                      min_new_tokens=new, do_sample=False, pad_token_id=0)  # fmt: skip

    def fresh():
        cache["kv"] = copy.deepcopy(filled)

    times = common.interleaved({"retrieval": ours, "base-2k": theirs}, args.repeats, between=fresh)
    model.base.set_attn_implementation("sdpa")  # the base's own attention after (unwrap)
    return {name: common.summarize(t) for name, t in times.items()}


def plot(data: dict[str, Any], path: Path) -> None:
    plt = common.pyplot()
    memory = data.get("memory", {})  # a run of --parts time alone has none
    fig, axes = plt.subplots(1, 2 if memory else 1, figsize=(10 if memory else 5, 4), squeeze=False)
    a = axes[0][0]
    for row, values in data["time"]["ms_per_token"].items():
        if values:
            xs = sorted(int(n) for n in values)
            a.plot(xs, [values[str(n)] for n in xs], marker="o", label=row)
    a.set(xscale="log", xlabel="tokens read", ylabel="ms / token", title="time per token")
    a.legend()
    if memory:
        b = axes[0][1]
        for row, m in memory.items():
            xs = sorted(int(n) for n in m["rss_mb"])
            b.plot(xs, [m["rss_mb"][str(n)] for n in xs], marker="o", label=row)
        b.set(xscale="log", xlabel="tokens read", ylabel="resident MiB", title="memory (VmRSS)")
        b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def memory_lines(mem: dict[str, Any]) -> list[str]:
    """The resident-memory table of the rows measured (none: a run of --parts time alone)."""
    if not mem:
        return []
    mlen = sorted({int(n) for m in mem.values() for n in m["rss_mb"]})
    mrows = []
    for row, m in mem.items():
        values = [m["rss_mb"].get(str(n)) for n in mlen]
        first, last = values[0], values[-1]
        growth = f"{(last / first - 1) * 100:+.1f}%" if first and last else "–"
        per_token = m["disk_bytes"] / m["tokens"] if m["tokens"] else 0
        mrows.append([row, *(f"{v:.0f}" if v else "–" for v in values), growth,
                      f"{per_token / 1024:.1f} KiB"])  # fmt: skip
    head = ["row", *(f"{n:,}" for n in mlen), "first → last", "disk per token"]
    return ["", "## Resident memory (MiB, each row alone in its own process)", "",
            common.markdown_table(head, mrows)]  # fmt: skip


def render(data: dict[str, Any]) -> str:
    s = data["setup"]
    t = data["time"]["ms_per_token"]
    lengths = sorted({int(n) for v in t.values() for n in v})
    lines = [
        "# Retrieval: cost per token and memory against stream length",
        "",
        f"`{data['command']}` on `{s['base_model']}`, batch 1, {s['threads']} torch thread(s), "
        f"blocks of {s['block']} tokens, rows taking turns block by block (module doc of "
        "`benchmarks/bench_retrieval.py`). Rendered from `retrieval_cost.json`.",
        "",
        "## ms per token (ratio to `window`, the base with a 2,048-token KV cache, same rounds)",
        "",
    ]
    rows = []
    for row, values in t.items():
        cells = []
        for n in lengths:
            if str(n) in values:
                ratio = values[str(n)] / t["window"][str(n)] if str(n) in t["window"] else None
                cells.append(f"{values[str(n)]:.2f} ({ratio:.2f}×)" if ratio else "–")
            else:
                cells.append("–")
        rows.append([row, *cells])
    lines.append(common.markdown_table(["row", *(f"{n:,}" for n in lengths)], rows))
    if "hybrid" in t and "retrieval" in t:  # what the continuous memory adds per token
        shared = [n for n in lengths if str(n) in t["hybrid"] and str(n) in t["retrieval"]]
        ratios = ", ".join(f"{n:,}: {t['hybrid'][str(n)] / t['retrieval'][str(n)]:.2f}×"
                           for n in shared)  # fmt: skip
        lines += ["", f"hybrid / retrieval per token (same rounds): {ratios}."]
    lines += memory_lines(data.get("memory") or {})
    if data.get("generate"):
        g = data["generate"]
        ours, theirs = g["retrieval"]["median_ms"], g["base-2k"]["median_ms"]
        n = s["new_tokens"]
        lines += [
            "",
            f"## generate: decoding {n} new tokens after {s['prompt']:,} (medians of "
            f"{s['repeats']}; the prompt read before, untimed)",
            "",
            f"retrieval {ours / n:.1f} ms/token, the base's own generate on the last 2,048 "
            f"tokens {theirs / n:.1f} ms/token: speed {theirs / ours:.2f}× the base's.",
        ]
    lines += ["", "![ms per token and memory](retrieval_cost.png)", "",
              common.machine_markdown(data["machine"]), ""]  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    if argv is None and "--worker" in sys.argv:
        import json

        i = sys.argv.index
        args = json.loads(sys.argv[i("--worker-args") + 1])
        result = memory_worker(args)
        Path(sys.argv[i("--worker-out") + 1]).write_text(json.dumps(result))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-model", default=None)
    p.add_argument("--lengths", default="4096,8192,16384")
    p.add_argument("--memory-lengths", default="8192,16384,32768")
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--full-limit", type=int, default=8192)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt", type=int, default=4096)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tiny", action="store_true", help="a random tiny Llama, short streams")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--parts", default="time,generate,memory",
                   help="measure these; keep the others from the JSON there")  # fmt: skip
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "benchmarks"))
    p.add_argument("--name", default="retrieval_cost", help="OUT/NAME.{json,md,png}")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    name = args.name
    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        import tempfile

        from tiny_pretrained import write_tiny_model

        folder = Path(tempfile.mkdtemp(prefix="bench-retrieval-"))
        args.base_model = str(write_tiny_model(folder, max_positions=4096))
        args.lengths, args.memory_lengths = "512,1024", "512,1024"
        args.block, args.full_limit, args.prompt, args.new_tokens = 64, 512, 2112, 4
        args.repeats, name = 2, "retrieval_cost_tiny"
    args.base_model = args.base_model or common.default_base_model()
    args.lengths = [int(x) for x in args.lengths.split(",")]
    args.rows = args.rows.split(",")
    for row in args.rows:
        if row not in (*ROWS, *RETRIEVAL_KIND, *OPTIONAL):
            known = ", ".join(dict.fromkeys(ROWS + RETRIEVAL_KIND + OPTIONAL))
            p.error(f"unknown row {row!r}; known: {known}")
    if "time" in args.parts.split(",") and "window" not in args.rows:
        p.error("the rows must include window (the ratios are against it)")
    base = load_base(args)
    data: dict[str, Any] = {
        "command": common.command_line(), "machine": common.machine_info(),
        "setup": {"base_model": Path(args.base_model).name, "threads": args.threads,
                  "block": args.block, "full_limit": args.full_limit, "prompt": args.prompt,
                  "new_tokens": args.new_tokens, "repeats": args.repeats},
    }  # fmt: skip
    parts = set(args.parts.split(","))
    old_path = Path(args.out) / f"{name}.json"
    if parts != {"time", "generate", "memory"} and old_path.exists():
        import json

        old = json.loads(old_path.read_text())
        data.update({k: old[k] for k in ("time", "generate", "memory") if k in old})
        data["command"] = f"{old['command']}; {data['command']}"
    if "time" in parts:
        data["time"] = time_rows(args, base)
    if "generate" in parts:
        data["generate"] = time_generate(args, base)
    memory_lengths = [int(x) for x in args.memory_lengths.split(",")]
    if "memory" in parts:
        data["memory"] = {
            row: common.run_worker(
                __file__,
                "memory",
                {
                    "row": row,
                    "base_model": args.base_model,
                    "lengths": memory_lengths,
                    "block": args.block,
                    "threads": args.threads,
                },
            )  # fmt: skip
            for row in MEMORY_ROWS
            if row in args.rows
        }
    out = Path(args.out)
    common.write_json(out / f"{name}.json", data)
    plot(data, out / f"{name}.png")
    page = render(data).replace("retrieval_cost", name)
    common.write_text(out / f"{name}.md", page + "\n" + common.kept_notes(out / f"{name}.md"))
    print(render(data))


if __name__ == "__main__":
    main()
