"""Resident memory of answering one long prompt with a saved memory model, as lm_eval's `hf`
model runs it (`AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`, then
`generate`): does the peak grow with the prompt's length?

    python experiments/ruler.py --rows paper --lengths 4096 --limit 1 --models-dir models
    python benchmarks/bench_prompt_memory.py --model-dir models/paper-gpt2 --lengths 2048,8192

Each length in a fresh process (its own peak): the model loaded and run once on a short text
(its weights read in), the peak set back to the resident memory, then `generate` of
`--new-tokens` greedy tokens after a random prompt of that many tokens; recorded: the peak less
the memory before (MiB) and the seconds. Writes OUT/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from inftyformer import _measure as common

OUT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks"


def worker(args: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args["threads"])
    model = AutoModelForCausalLM.from_pretrained(
        args["model_dir"], trust_remote_code=True, dtype=torch.float32
    ).eval()
    vocab = int(model.get_input_embeddings().num_embeddings)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, args["length"]), generator=g)
    with torch.no_grad():
        model(ids[:, :64])  # the weights read in before the peak is reset
        common.reset_peak_rss()
        before = common.rss_mb()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                       max_new_tokens=args["new_tokens"])  # fmt: skip
        seconds = time.perf_counter() - start
    added = common.peak_rss_mb() - before
    return {"length": args["length"], "rss_before_mb": round(before, 1),
            "added_mb": round(added, 1), "seconds": round(seconds, 1)}  # fmt: skip


def render(data: dict[str, Any], path: Path) -> str:
    rows = [(f"{r['length']:,}", f"{r['added_mb']:,.0f}", f"{r['rss_before_mb']:,.0f}",
             f"{r['seconds']:.0f}") for r in data["runs"]]  # fmt: skip
    table = common.markdown_table(["prompt tokens", "peak added (MiB)", "before (MiB)", "s"], rows)
    return "\n".join([
        "# Resident memory of one long prompt through a saved memory model",
        "",
        f"`{data['command']}` on `{data['model']}` (commit {data['revision']}), "
        f"{data['new_tokens']} new tokens, {data['threads']} torch thread(s), each length in a "
        "fresh process (module doc of `benchmarks/bench_prompt_memory.py`). Rendered from "
        f"`{path.stem}.json`.",
        "",
        table,
        "",
        common.machine_markdown(data["machine"]),
        "",
        common.kept_notes(path),
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    if argv is None and "--worker" in sys.argv:
        i = sys.argv.index
        result = worker(json.loads(sys.argv[i("--worker-args") + 1]))
        Path(sys.argv[i("--worker-out") + 1]).write_text(json.dumps(result))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True, help="a saved memory model (config.json)")
    p.add_argument("--lengths", default="2048,8192")
    p.add_argument("--new-tokens", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--name", default="prompt_memory")
    a = p.parse_args(argv)
    folder = Path(a.model_dir)
    if not (folder / "config.json").is_file():
        raise SystemExit(f"--model-dir {folder}: no config.json (a saved memory model folder)")
    lengths = [int(x) for x in a.lengths.split(",")]
    if not lengths or min(lengths) < 65:
        raise SystemExit("--lengths: prompt lengths above 64 tokens, comma-separated")
    import torch

    torch.set_num_threads(a.threads)  # as in the workers, for the machine lines
    runs = []
    for length in lengths:
        args = {"model_dir": str(folder), "length": length, "new_tokens": a.new_tokens,
                "threads": a.threads}  # fmt: skip
        runs.append(common.run_worker(__file__, "generate", args))
        print(runs[-1], flush=True)
    data = {"command": common.command_line(), "model": folder.name, "new_tokens": a.new_tokens,
            "threads": a.threads, "revision": common.git_revision(OUT.parent.parent),
            "machine": common.machine_info(), "runs": runs}  # fmt: skip
    out = Path(a.out) / f"{a.name}.json"
    common.write_json(out, data)
    common.write_text(out.with_suffix(".md"), render(data, out.with_suffix(".md")))


if __name__ == "__main__":
    main()
