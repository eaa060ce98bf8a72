"""Which memory settings to recommend for `--base-model`, by measurement (`bench_pretrained.py`).

Candidates: a memory in every block, or in four late blocks (15, 19, 23, 27 of SmolLM2's 30),
with N = M = 512 (the paper's) or 256. For each: the parameters it trains, the size of an
adapter checkpoint (memory weights + AdamW moments, safetensors) against the base's weights,
and its streaming cost per token against the base over the same window (forward, steady state,
interleaved). The recommended candidate is the one with the most memory (blocks, then N) that
meets the parameter, checkpoint and streaming goals. At that setting, also: bf16 autocast,
generation speed against the base's own `generate` (per token, timestamped by a streamer), and,
through the command line, a frozen-base training run (peak RSS, its checkpoint) and
`inftyformer generate RUN` (wall and CPU seconds, model load included).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from inftyformer import _measure as common

# the goals (thresholds, not measurements)
GOALS = {
    "trained_fraction": 0.15,  # trained parameters / base parameters, at most
    "checkpoint_fraction": 0.25,  # adapter checkpoint / base weights, at most
    "stream_ratio": 1.3,  # forward per token / the base's over the same window, at most
    "train_rss_gb": 3.0,  # peak RSS of a frozen-base training run (batch 4 x 256), at most
    "generate_ratio": 0.8,  # tokens/s against the base's generate, at least
    "cli_seconds": 10.0,  # `inftyformer generate RUN` wall seconds (load + 20 tokens), at most
}


def late_blocks(layers: int, count: int = 4) -> list[int]:
    """`count` evenly spaced blocks of the second half: 15, 19, 23, 27 of 30."""
    start = layers // 2
    step = max((layers - 1 - start) // max(count - 1, 1), 1)
    return sorted({min(start + k * step, layers - 1) for k in range(count)})


def candidates(layers: int, sizes: tuple[int, int]) -> list[dict[str, Any]]:
    """Most memory first (the order the choice prefers)."""
    late = late_blocks(layers)
    big, small = sizes
    rows = [
        (None, big),
        (late, big),
        (late, small),
    ]
    return [
        {
            "name": f"{'every block' if blocks is None else 'blocks ' + ','.join(map(str, blocks))}"
            f", N {n}",
            "memory_layers": blocks,
            "num_basis": n,
            "num_samples": n,
        }
        for blocks, n in rows
    ]


def wrap(base, candidate: dict[str, Any], segment_len: int):
    from inftyformer.hf import add_long_term_memory

    keys = ("memory_layers", "num_basis", "num_samples")
    return add_long_term_memory(
        base, segment_len=segment_len, **{k: candidate[k] for k in keys}
    ).eval()


def base_bytes(base, model_dir: Path | None) -> int:
    """The base's weights on disk: its safetensors files, else its tensors' bytes."""
    files = sorted(model_dir.glob("*.safetensors")) if model_dir else []
    if files:
        return sum(p.stat().st_size for p in files)
    seen = {t.data_ptr(): t.numel() * t.element_size() for t in base.state_dict().values()}
    return sum(seen.values())


def adapter_checkpoint_bytes(model) -> int:
    """Bytes of a safetensors file with the memory's weights and AdamW's two moments (after a
    step on zero gradients): what a frozen-base checkpoint holds besides its metadata."""
    from safetensors.torch import save_file

    params = dict(model.long_term.named_parameters())
    saved = {n: p.detach().clone() for n, p in params.items()}
    opt = torch.optim.AdamW(list(params.values()), lr=0.0)
    for p in params.values():
        p.grad = torch.zeros_like(p)
    opt.step()
    tensors = dict(saved)
    for n, p in params.items():
        p.grad = None
        for k, v in opt.state[p].items():
            if isinstance(v, torch.Tensor) and v.dim():
                tensors[f"{n}.{k}"] = v
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "adapter.safetensors"
        save_file(tensors, str(path))
        return path.stat().st_size


def carried_state_bytes(model, ids, L: int) -> int:
    """Bytes (safetensors) of the memory a training run carries for ids' rows after three
    segments (a filled memory, a segment waiting to be fitted, a window): what a run's checkpoint
    holds besides the adapter's weights and moments, to resume its streams exactly."""
    from safetensors.torch import save

    memory = None
    with torch.no_grad():
        for k in range(3):
            memory = model(ids[:, k * L : (k + 1) * L], state=memory).state
    return len(save({k: v.contiguous() for k, v in memory.tensors().items()}))


def _bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def streaming_cost(base, models: dict[str, Any], ids, L: int, repeats: int, bf16: set[str]):
    """Forward of one segment (ids[:, 2L:3L]) after two streamed ones, against the base on the
    same window + segment (ids[:, L:3L]); fp32, and bf16 autocast for the names in `bf16`.
    Medians of per-round ratios; also the bf16 logits against fp32 (max |Δ|, mean NLL)."""
    segment, both = ids[:, 2 * L : 3 * L], ids[:, L : 3 * L]
    memories = {}
    with torch.no_grad():
        for name, model in models.items():
            memory = model(ids[:, :L]).state
            memories[name] = model(ids[:, L : 2 * L], state=memory).state
            if model.config.adapter.window != L:
                raise ValueError(f"{name}: window {model.config.adapter.window} != L {L}")
    last: dict[str, torch.Tensor] = {}

    def run(key, fn, precision):
        def call():
            with torch.no_grad(), _bf16() if precision == "bf16" else contextlib.nullcontext():
                last[key] = fn().logits[:, -L:].float()

        return call

    def base_call():  # the logits of the segment only, as the memory model computes them
        return base(both, logits_to_keep=L)

    variants = {"base|fp32": run("base|fp32", base_call, "fp32")}
    if bf16:
        variants["base|bf16"] = run("base|bf16", base_call, "bf16")
    for name, model in models.items():
        for precision in ("fp32", "bf16") if name in bf16 else ("fp32",):
            key = f"{name}|{precision}"
            fn = lambda m=model, mem=memories[name]: m(segment, state=mem)  # noqa: E731
            variants[key] = run(key, fn, precision)
    times = common.interleaved(variants, repeats=repeats, warmup=1)
    tokens = segment.numel()
    rows = {}
    for key, t in times.items():
        name, precision = key.split("|")
        ref = times[f"base|{precision}"]
        fp32 = times[f"{name}|fp32"]
        nll = torch.nn.functional.cross_entropy(
            last[key][:, :-1].flatten(0, 1), segment[:, 1:].flatten()
        )
        rows[key] = {
            "name": name,
            "precision": precision,
            "time": common.summarize(t),
            "ms_per_token": 1000 * statistics.median(t) / tokens,
            "ratio_to_base": statistics.median(y / x for x, y in zip(ref, t, strict=True)),
            "ratio_min": min(y / x for x, y in zip(ref, t, strict=True)),
            "ratio_max": max(y / x for x, y in zip(ref, t, strict=True)),
            "speed_vs_fp32": statistics.median(x / y for x, y in zip(fp32, t, strict=True)),
            "nll": float(nll),
            "max_abs_logit_diff_vs_fp32": float((last[key] - last[f"{name}|fp32"]).abs().max()),
        }
    return rows


def choose(rows: list[dict[str, Any]]) -> int:
    """Index of the first candidate (most memory first) meeting the parameter, checkpoint (a
    run's: with the memory it carries, when measured) and streaming goals; else the one with the
    lowest streaming ratio."""
    for i, row in enumerate(rows):
        if (
            row["trained_fraction"] <= GOALS["trained_fraction"]
            and row.get("run_checkpoint_fraction", row["checkpoint_fraction"])
            <= GOALS["checkpoint_fraction"]
            and row["stream"]["ratio_to_base"] <= GOALS["stream_ratio"]
        ):
            return i
    return min(range(len(rows)), key=lambda i: rows[i]["stream"]["ratio_to_base"])


# ----------------------------------------------------------------------------- generation
class _Clock:
    """A streamer that timestamps each put (the prompt first, then one per new token)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def generation_speed(base, model, ids, L: int, prompt_len: int, new: int, repeats: int):
    """Greedy generation, batch 1: the memory model (two segments streamed, so it has a window
    of L tokens and a filled memory) against the base on the same prompt and on window + prompt.
    Per variant: seconds to the first new token (prefill) and tokens/s of the rest (decoding)."""
    ids = ids[:1]
    with torch.no_grad():
        memory = model(ids[:, :L]).state
        memory = model(ids[:, L : 2 * L], state=memory).state
    prompt = ids[:, 2 * L : 2 * L + prompt_len]
    context = ids[:, L : 2 * L + prompt_len]
    options = dict(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, eos_token_id=None
    )
    stamps: dict[str, list[tuple[float, float]]] = {}

    def run(name, fn, inputs, **extra):
        def call():
            clock = _Clock()
            start = time.perf_counter()
            with torch.no_grad():
                fn(inputs, streamer=clock, **options, **extra)
            first, last = clock.stamps[1], clock.stamps[-1]
            stamps.setdefault(name, []).append((first - start, (new - 1) / (last - first)))

        return call

    variants = {
        "base, same prompt": run("base, same prompt", base.generate, prompt),
        "base, window + prompt": run("base, window + prompt", base.generate, context),
        "memory model": run("memory model", model.generate, prompt, state=memory),
    }
    common.interleaved(variants, repeats=repeats, warmup=1)
    out = {}
    for name, values in stamps.items():
        values = values[1:]  # the warm-up round
        out[name] = {
            "prefill_seconds": statistics.median(v[0] for v in values),
            "decode_tokens_per_s": statistics.median(v[1] for v in values),
        }
    mem = [v[1] for v in stamps["memory model"][1:]]
    for ref in ("base, same prompt", "base, window + prompt"):
        base_rate = [v[1] for v in stamps[ref][1:]]
        out["memory model"][f"decode_ratio_to_{ref}"] = statistics.median(
            m / b for m, b in zip(mem, base_rate, strict=True)
        )
    return {"prompt_tokens": prompt_len, "new_tokens": new, "window": L, "rows": out}


# ----------------------------------------------------------------------------- command line
# The child runs under a small launcher that reports its resources: a process's peak RSS
# (ru_maxrss) counts the memory of the process it was forked from until it execs, so a command
# started straight from this (large) process would report at least this process's peak.
_LAUNCHER = """
import json, os, subprocess, sys, time
start = time.perf_counter()
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
report = {"wall_seconds": time.perf_counter() - start,
          "cpu_seconds": usage.ru_utime + usage.ru_stime,
          "peak_rss_bytes": usage.ru_maxrss * 1024}  # Linux: KiB
with open(sys.argv[1], "w") as f:
    json.dump(report, f)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _run_child(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    """Run `cmd`, returning its wall seconds, CPU seconds (user + system) and peak RSS (wait4 in
    a small launcher, so that this process's own memory is not counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "usage.json"
        launch = [sys.executable, "-c", _LAUNCHER, str(report), *cmd]
        proc = subprocess.run(launch, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        output = proc.stdout.decode(errors="replace")
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
        usage = json.loads(report.read_text())
    return {**usage, "output_tail": output[-600:]}


def small_corpus(root: Path, books: list[Path], chars: int) -> Path:
    """train/ valid/ test/ folders of the first `chars` characters of a few books (so that the
    command-line run does not tokenise a whole corpus)."""
    for split, picks in (("train", books[:4]), ("valid", books[:1]), ("test", books[:1])):
        (root / split).mkdir(parents=True, exist_ok=True)
        for i, book in enumerate(picks):
            text = book.read_text(encoding="utf-8")[:chars]
            (root / split / f"{i}.txt").write_text(text, encoding="utf-8")
    return root


def command_line(model_dir: Path, candidate: dict[str, Any], books: list[Path], args) -> dict:
    """`inftyformer train lm --base-model DIR --freeze-base` at the candidate's settings, halted
    after two steps (the second in steady state: a window and a fit), batch B x L; then
    `inftyformer generate RUN --prompt ... --max-new-tokens 20`, twice (cold, warm cache)."""
    exe = [sys.executable, "-m", "inftyformer.cli"]
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        data = small_corpus(Path(tmp) / "corpus", books, 40 * args.segment_len * 8)
        run = Path(tmp) / "run"
        sets = [
            f"segment_len={args.segment_len}",
            f"num_basis={candidate['num_basis']}",
            f"num_samples={candidate['num_samples']}",
            "warmup_steps=1",
            "halt_after=2",
        ]
        if candidate["memory_layers"] is not None:
            sets.append("memory_layers=" + ",".join(map(str, candidate["memory_layers"])))
        train_cmd = [
            *exe, "train", "lm", "--base-model", str(model_dir), "--freeze-base",
            "--data-dir", str(data), "-b", str(args.batch), "--threads", str(args.threads),
            "--steps", "100", "--eval-every", "100", "-o", str(run),
        ]  # fmt: skip
        for s in sets:
            train_cmd += ["--set", s]
        train = _run_child(train_cmd, env)
        files = {p.name: p.stat().st_size for p in sorted(run.iterdir()) if p.is_file()}
        train["checkpoint_bytes"] = sum(v for k, v in files.items() if k.startswith("last."))
        train["files"] = files
        train["command"] = "inftyformer " + " ".join(train_cmd[3:]).replace(tmp, "TMP")
        gen_cmd = [*exe, "generate", str(run), "--prompt", args.prompt, "--max-new-tokens", "20"]
        generate = [_run_child(gen_cmd, env) for _ in range(2)]
        for g in generate:
            g["command"] = "inftyformer " + " ".join(gen_cmd[3:]).replace(tmp, "TMP")
    return {"train": train, "generate": generate}


def measure_generation(base, model, ids, args, activate) -> dict[str, Any]:
    """`generation_speed` of `model` with reads that change the logits, as after training."""
    activate(model)
    generation = generation_speed(
        base, model, ids, args.segment_len, args.prompt_tokens, args.new_tokens,
        args.settings_repeats,
    )  # fmt: skip
    generation["command"] = common.command_line()
    generation["load_average"] = common.machine_info()["load_average"]
    print("generation speed", generation, flush=True)
    return generation


def measure(
    base, model_dir: Path | None, ids, args, books: list[Path], activate, previous=None
) -> dict[str, Any]:
    """Every candidate's parameters, checkpoint size and streaming cost; the choice; at the
    chosen setting bf16, generation speed and (with a model directory) the command line.
    `previous` (an earlier result, `--keep-timings`): its streaming timings are kept, and its
    generation speed when the choice is the same; sizes and the command line are measured."""
    L = args.segment_len
    layers = int(base.config.num_hidden_layers)
    sizes = (16, 8) if args.tiny else (512, 256)
    rows = candidates(layers, sizes)
    base_params = sum(p.numel() for p in base.parameters())
    size = base_bytes(base, model_dir)
    models = {}
    for row in rows:
        model = wrap(base, row, L)
        models[row["name"]] = model
        row["trained_params"] = sum(p.numel() for p in model.memory_parameters())
        row["trained_fraction"] = row["trained_params"] / base_params
        row["checkpoint_bytes"] = adapter_checkpoint_bytes(model)
        row["checkpoint_fraction"] = row["checkpoint_bytes"] / size
        row["carried_bytes"] = carried_state_bytes(model, ids[: args.batch], L)
        row["run_checkpoint_bytes"] = row["checkpoint_bytes"] + row["carried_bytes"]
        row["run_checkpoint_fraction"] = row["run_checkpoint_bytes"] / size
    bf16 = {row["name"] for row in rows if row["memory_layers"] is not None}
    if previous is None:
        cost_ids = ids[: args.cost_batch, : 3 * L]
        stream = streaming_cost(base, models, cost_ids, L, args.settings_repeats, bf16)
        timings = None
    else:  # the earlier run's timings (a quiet machine), the rest measured now
        stream = dict(previous["base_stream"])
        old = {r["name"]: r for r in previous["candidates"]}
        for row in rows:
            stream[f"{row['name']}|fp32"] = old[row["name"]]["stream"]
            if "stream_bf16" in old[row["name"]]:
                stream[f"{row['name']}|bf16"] = old[row["name"]]["stream_bf16"]
        timings = previous.get("timings_from") or {k: previous[k] for k in ("command", "machine")}
    print("settings cost", {k: round(v["ratio_to_base"], 3) for k, v in stream.items()})
    for row in rows:
        row["stream"] = stream[f"{row['name']}|fp32"]
        if f"{row['name']}|bf16" in stream:
            row["stream_bf16"] = stream[f"{row['name']}|bf16"]
    chosen = choose(rows)
    model = models[rows[chosen]["name"]]
    for other in models.values():
        if other is not model:
            other.unwrap()
    same = (
        previous is not None
        and previous["candidates"][previous["chosen"]]["name"] == (rows[chosen]["name"])
    )
    if same:
        generation = previous["generation"]
    else:
        generation = measure_generation(base, model, ids, args, activate)
    cli = None
    if model_dir is not None and not args.no_cli:
        cli = command_line(model_dir, rows[chosen], books, args)
        print("command line", {k: v for k, v in cli["train"].items() if k != "output_tail"})
    model.unwrap()
    return {
        "command": common.command_line(),
        "machine": common.machine_info(),
        "goals": GOALS,
        "base_params": base_params,
        "base_bytes": size,
        "batch": args.cost_batch,
        "train_batch": args.batch,
        "segment_len": L,
        "repeats": args.settings_repeats,
        "candidates": rows,
        "base_stream": {k: v for k, v in stream.items() if v["name"] == "base"},
        "chosen": chosen,
        "generation": generation,
        "command_line": cli,
        **({} if timings is None else {"timings_from": timings}),
    }
