"""Where the ∞-former's training step spends the time it takes beyond Transformer-XL's, at
cpu-small (the shapes of `bench_models.py`'s first table: batch 8, segment 128).

    nice -n 5 python benchmarks/profile_step.py            # ≈ 3 min on 2 shared cores
    python benchmarks/profile_step.py --render-only        # step_profile.md from the JSON

Writes docs/benchmarks/step_profile.{json,md}:

1. The step-time ratio: a training step (zero_grad, forward with targets, backward, Adam step)
   of each model with its memory full, the two models taking turns (`_measure.interleaved`), so
   that the load of a shared machine falls on both; the median of the per-round ratios.
2. The FLOP ratio, as `bench_models.py` counts it (torch's FlopCounterMode: matrix products and
   convolutions of forward + backward), and the same FLOPs split by part of the step.
3. A torch.profiler trace (CPU, record_shapes) of profiled steps of both models, interleaved.
   Each part of the step is a `record_function` label, set for the profile only by wrapping the
   functions that compute it (the library is not changed and the timed steps are not wrapped).
   Forward time is attributed to the innermost label around it; a backward node's time to the
   label of the forward operation that made it (the profiler's sequence numbers); the Adam step
   and the autograd engine's own time are parts of their own. Per part: the time in aten
   operations and the rest (Python, argument handling, dispatch between them), the number of
   operations, and its FLOPs.

The extra time of a part is its time in the ∞-former's step minus its time in XL's (parts only
the ∞-former has count whole); "at XL's rate" is the time its extra FLOPs would take at the
FLOPs per second of XL's whole step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_models_measure import SIZES, VOCAB, make_config  # noqa: E402

from inftyformer import _measure as common  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "docs" / "benchmarks"
SIZE = "cpu-small"
MODELS = ("xl", "infty")

# The parts of a step: (label, what it computes, in the method's FLOP count). Each label wraps
# the functions listed in `_targets`; a part's time excludes the parts nested inside it.
PARTS: dict[str, tuple[str, bool]] = {
    "model": ("embedding, argument and state checks, final LayerNorm, tied head, loss", True),
    "block": ("the block's LayerNorms, FFN, residuals, the layer's glue", True),
    "self_attention": ("relative multi-head attention over [memory ; segment]", True),
    "short_term": ("short-term memory: what leaves, append", False),
    "ltm.update": (
        "long-term update: parameter-free LayerNorm, the new state, row selection",
        False,
    ),
    "ltm.gate": ("the CNN gate X ⊙ sigmoid(Conv1d(X))", True),
    "ltm.squeeze": ("the update's squeeze: sample positions, design lookup, [x̃ ; X]", False),
    "ltm.resample": (
        "x̃ = B_pastᵀ ψ(u): the old signal read at M positions (basis evaluation)",
        True,
    ),
    "ltm.ridge_fit": ("B = G_infᵀ [x̃ ; X]: the ridge fit with the cached design", True),
    "ltm.prepare": ("keys and values of the memory: V = B W^V, folded heads, score moments", True),
    "ltm.density": ("μ, σ² of each query: standardised scores, heads", True),
    "ltm.read": ("the continuous softmax z = E_p[ψ]ᵀ V (fused, blocked)", True),
    "ltm.attention": ("heads merged, output projection, empty-row mask, the read's mean KL", True),
    "ltm.kl": ("the KL term per token", True),
    "backward_engine": ("autograd engine time outside any node", False),
    "accumulate_grad": ("gradients accumulated into the parameters", False),
    "optimizer": ("Adam step and zero_grad", False),
}


def _targets() -> dict[str, list[tuple[Any, str]]]:
    """Which functions each label wraps: (owner, attribute)."""
    from inftyformer.core import attention, memory, squeeze
    from inftyformer.extensions import densities
    from inftyformer.native import block, model, relative_attention, short_term_memory

    return {
        "model": [(model.MemoryLM, "forward")],
        "block": [(block.MemoryBlock, "forward")],
        "self_attention": [(relative_attention.RelativeMultiHeadAttention, "forward")],
        "short_term": [
            (short_term_memory.ShortTermMemory, "flush"),
            (short_term_memory.ShortTermMemory, "append"),
        ],
        "ltm.update": [
            (block.MemoryBlock, "_update_long_term"),
            (memory.LongTermMemory, "_update"),
        ],
        "ltm.gate": [(memory.LongTermMemory, "smooth")],
        "ltm.squeeze": [(squeeze.ResamplingSqueeze, "fit")],
        "ltm.resample": [(squeeze, "_evaluate_signal")],
        "ltm.ridge_fit": [(squeeze, "_fit_coefficients")],
        "ltm.prepare": [(densities.NormalizedDensity, "prepare")],
        "ltm.density": [(densities.NormalizedDensity, "read")],
        "ltm.read": [(attention.LongTermAttention, "expected_values")],
        "ltm.attention": [(attention.LongTermAttention, "forward")],
        "ltm.kl": [(block, "token_kl")],
    }


class _Labels:
    """The stack of labels of the running forward (for the FLOP count)."""

    def __init__(self) -> None:
        self.stack: list[str] = []


@contextlib.contextmanager
def labelled(labels: _Labels) -> Iterator[None]:
    """Wrap every target in a `record_function("part:<label>")` and push its label on
    `labels.stack` while it runs; the originals are put back on exit."""
    saved = []

    def wrap(label: str, fn: Callable) -> Callable:
        def wrapped(*args, **kwargs):
            labels.stack.append(label)
            try:
                with torch.profiler.record_function("part:" + label):
                    return fn(*args, **kwargs)
            finally:
                labels.stack.pop()

        return wrapped

    try:
        for label, targets in _targets().items():
            for owner, name in targets:
                original = owner.__dict__[name]
                saved.append((owner, name, original))
                setattr(owner, name, wrap(label, original))
        yield
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


# ----------------------------------------------------------------------------- the steps
def _build(threads: int):
    from inftyformer import MemoryLM

    torch.set_num_threads(threads)
    batch = SIZES[SIZE]["batch"]
    models, optims = {}, {}
    for mt in MODELS:
        torch.manual_seed(0)
        models[mt] = MemoryLM(make_config(SIZE, mt)).train()
        optims[mt] = torch.optim.Adam(models[mt].parameters(), lr=1e-4)
    L = models["xl"].config.segment_len
    tokens = torch.randint(0, VOCAB, (batch, L), generator=torch.Generator().manual_seed(0))
    states: dict[str, Any] = {mt: None for mt in MODELS}

    def step(mt: str, phases: bool = False) -> Callable[[], None]:
        # phases: record_function labels around the step's phases (profiled steps only)
        def label(name: str):
            return torch.profiler.record_function(name) if phases else contextlib.nullcontext()

        def call() -> None:
            with label("phase:optimizer"):
                optims[mt].zero_grad(set_to_none=True)
            with label("phase:forward"):
                out = models[mt](tokens, states[mt], targets=tokens)
            with label("phase:backward"):
                out.loss.backward()
            with label("phase:optimizer"):
                optims[mt].step()
            states[mt] = out.state

        return call

    return models, optims, tokens, states, step


# ----------------------------------------------------------------------------- FLOPs by part
def _count_flops(models, tokens, states, labels: _Labels) -> dict[str, dict[str, float]]:
    """Matrix-product and convolution FLOPs of one training step (forward + backward) per part
    and model, counted with torch's FLOP formulas (those of FlopCounterMode). A forward op
    counts for the innermost label around it; a backward op for the label of the forward call
    that made its autograd node (each node is tagged when the call that made it returns)."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils.flop_counter import flop_registry

    def tag(t: Any, label: str) -> None:
        # the nodes this call made: walk back from its outputs to nodes already tagged
        todo = [t.grad_fn] if isinstance(t, torch.Tensor) and t.grad_fn is not None else []
        while todo:
            node = todo.pop()
            if node is None or "part" in node.metadata:
                continue
            node.metadata["part"] = label
            todo.extend(next_node for next_node, _ in node.next_functions)

    class Tagger(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            label = labels.stack[-1] if labels.stack else "model"
            for t in out if isinstance(out, tuple | list) else (out,):
                tag(t, label)
            return out

    counts: dict[str, float] = defaultdict(float)

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            formula = flop_registry.get(func.overloadpacket)
            if formula is not None:
                node = torch._C._current_autograd_node()
                if node is not None:  # backward
                    label = node.metadata.get("part", "model")
                else:
                    label = labels.stack[-1] if labels.stack else "model"
                counts[label] += formula(*args, **(kwargs or {}), out_val=out)
            return out

    result = {}
    with labelled(labels):
        for mt, model in models.items():
            counts.clear()
            with Tagger(), Counter():
                out = model(tokens, states[mt], targets=tokens)
            with Counter():
                out.loss.backward()
            model.zero_grad(set_to_none=True)
            result[mt] = dict(counts)
    return result


# ----------------------------------------------------------------------------- the profile
def _attribute(events) -> dict[str, dict[str, dict[str, float]]]:
    """Per step region ("step:<model>") of a profile: per part, the time (µs) of the part in
    aten operations (`ops_us`), in all (`total_us`) and the number of top-level operations."""

    def parts_of(step) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        ops: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        seq_label: dict[int, str] = {}

        def forward(event, label: str) -> None:
            # the time of this label's region minus that of the labels nested inside it
            for child in event.cpu_children:
                if child.name.startswith("part:"):
                    inner = child.name[len("part:") :]
                    out[label]["total_us"] -= child.cpu_time_total
                    out[inner]["total_us"] += child.cpu_time_total
                    forward(child, inner)
                else:
                    out[label]["ops_us"] += child.cpu_time_total
                    out[label]["ops"] += 1
                    _sequence(child, label)
                    _operators(child, label)

        def _operators(event, label: str) -> None:
            # self time of every operation inside, by name
            ops[label][event.name] += event.self_cpu_time_total
            for child in event.cpu_children:
                _operators(child, label)

        def _sequence(event, label: str) -> None:
            # the op that makes an autograd node is the last one to start with its number
            if event.sequence_nr >= 0:
                seq_label[event.sequence_nr] = label
            for child in event.cpu_children:
                if child.name.startswith("part:"):  # cannot happen inside an op, but be safe
                    continue
                _sequence(child, label)

        phases = [c for c in step.cpu_children if c.name.startswith("phase:")]
        for phase in phases:
            if phase.name == "phase:forward":
                for child in phase.cpu_children:
                    if child.name.startswith("part:"):
                        inner = child.name[len("part:") :]
                        out[inner]["total_us"] += child.cpu_time_total
                        forward(child, inner)
        for phase in phases:
            if phase.name == "phase:backward":
                nodes = 0.0
                for node in _nodes(phase):
                    kind = node.name.split(": ", 1)[-1]
                    if kind.startswith("torch::autograd::AccumulateGrad"):
                        label = "accumulate_grad"
                    else:
                        label = _label_of(seq_label, node.sequence_nr)
                    out[label]["total_us"] += node.cpu_time_total
                    out[label]["ops_us"] += node.cpu_time_total
                    out[label]["backward_us"] += node.cpu_time_total
                    out[label]["ops"] += 1
                    nodes += node.cpu_time_total
                    _operators(node, label)
                out["backward_engine"]["total_us"] += phase.cpu_time_total - nodes
            elif phase.name == "phase:optimizer":
                out["optimizer"]["total_us"] += phase.cpu_time_total
                out["optimizer"]["ops_us"] += sum(c.cpu_time_total for c in phase.cpu_children)
                out["optimizer"]["ops"] += len(phase.cpu_children)
        for label, by_name in ops.items():
            out[label]["operators"] = dict(by_name)
        return {k: dict(v) for k, v in out.items()}

    result: dict[str, list] = defaultdict(list)
    for e in events:
        if e.name.startswith("step:") and e.cpu_parent is None:
            result[e.name[len("step:") :]].append((parts_of(e), e.cpu_time_total))
    return result


def _label_of(seq_label: dict[int, str], sequence_nr: int) -> str:
    """The label of the forward op that made the node numbered `sequence_nr`. An in-place op on
    a view makes its node (CopySlices, AsStridedBackward0) with a number of its own, after the
    op's: those take the label of the last forward op numbered before them."""
    if sequence_nr in seq_label:
        return seq_label[sequence_nr]
    before = [n for n in seq_label if n < sequence_nr]
    return seq_label[max(before)] if before else "unattributed"


def _nodes(event):
    """The autograd nodes evaluated inside `event` (outermost ones)."""
    for child in event.cpu_children:
        if child.name.startswith("autograd::engine::evaluate_function"):
            yield child
        else:
            yield from _nodes(child)


def _operators(events) -> dict[str, dict[str, float]]:
    """Self CPU time (µs) and calls per aten operator and model, summed over the profiled
    steps."""
    out: dict[str, dict[str, list[float]]] = {}

    def visit(event, model: str) -> None:
        if event.name.startswith("aten::"):
            entry = out.setdefault(model, {}).setdefault(event.name, [0.0, 0])
            entry[0] += event.self_cpu_time_total
            entry[1] += 1
        for child in event.cpu_children:
            visit(child, model)

    for e in events:
        if e.name.startswith("step:") and e.cpu_parent is None:
            visit(e, e.name[len("step:") :])
    return {m: {k: {"self_us": v[0], "calls": v[1]} for k, v in d.items()} for m, d in out.items()}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile, record_function

    models, optims, tokens, states, step = _build(args.threads)
    load_before = list(os.getloadavg())
    t0 = time.perf_counter()
    # 1. the ratio: unwrapped steps, taking turns (warm-up fills and overflows the memories)
    times = common.interleaved({mt: step(mt) for mt in MODELS}, args.repeats, warmup=args.warmup)
    ratios = [a / b for a, b in zip(times["infty"], times["xl"], strict=True)]
    # 2. FLOPs per part (one step each, not timed)
    labels = _Labels()
    flops = _count_flops(models, tokens, states, labels)
    # 3. the profile: wrapped steps, taking turns
    with labelled(labels):
        for _ in range(2):  # warm-up of the wrapped path
            for mt in MODELS:
                step(mt)()
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for r in range(args.profile_steps):
                for mt in MODELS if r % 2 == 0 else MODELS[::-1]:
                    with record_function("step:" + mt):
                        step(mt, phases=True)()
    events = prof.events()
    attributed = _attribute(events)
    operators = _operators(events)
    n = {mt: len(attributed[mt]) for mt in MODELS}
    parts: dict[str, dict[str, dict[str, Any]]] = {}
    for mt in MODELS:
        # per part: the median over the profiled steps of each time (a step that met a burst of
        # load elsewhere moves a mean), the mean of the counts and of the operators' self times
        steps = [one for one, _ in attributed[mt]]
        parts[mt] = {}
        for label in sorted({label for one in steps for label in one}):
            entry: dict[str, Any] = {}
            for key in ("total_us", "ops_us", "backward_us"):
                values = [one.get(label, {}).get(key, 0.0) / 1000.0 for one in steps]
                entry[key.replace("_us", "_ms")] = statistics.median(values)
            entry["ops"] = statistics.fmean(one.get(label, {}).get("ops", 0) for one in steps)
            by_name: dict[str, float] = defaultdict(float)
            for one in steps:
                for name, us in one.get(label, {}).get("operators", {}).items():
                    by_name[name] += us / len(steps) / 1000.0
            entry["operators_self_ms"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1]))
            parts[mt][label] = entry
    return {
        "command": common.command_line(),
        "machine": dict(common.machine_info(), load_average=load_before),
        "load_average_before": load_before,
        "load_average_after": list(os.getloadavg()),
        "revision": common.git_revision(ROOT, ["src", "benchmarks"]),
        "settings": {
            "size": SIZE,
            "batch": SIZES[SIZE]["batch"],
            "config": make_config(SIZE, "infty").to_dict(),
            "threads": args.threads,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "profile_steps": args.profile_steps,
            "nice": os.nice(0),
        },
        "step": {mt: common.summarize(times[mt]) for mt in MODELS},
        "ratio": {
            "median": statistics.median(ratios),
            "q1": statistics.quantiles(ratios, n=4, method="inclusive")[0],
            "q3": statistics.quantiles(ratios, n=4, method="inclusive")[2],
        },
        "flops": {mt: {"total": sum(f.values()), "parts": f} for mt, f in flops.items()},
        "profiled_step_ms": {
            mt: statistics.median(t / 1000.0 for _, t in attributed[mt]) for mt in MODELS
        },
        "parts": parts,
        "operators": {
            mt: {
                k: {"self_ms": v["self_us"] / n[mt] / 1000.0, "calls": v["calls"] / n[mt]}
                for k, v in operators[mt].items()
            }
            for mt in MODELS
        },
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--repeats", type=int, default=40, help="timed rounds")
    parser.add_argument("--warmup", type=int, default=4, help="untimed rounds first")
    parser.add_argument("--profile-steps", type=int, default=8, help="profiled steps per model")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    parser.add_argument("--render-only", action="store_true", help="re-render the Markdown")
    args = parser.parse_args()
    from _profile_step_report import write_report

    path = args.out / "step_profile.json"
    if args.render_only:
        write_report(json.loads(path.read_text()), args.out)
        return
    result = measure(args)
    common.write_json(path, result)
    write_report(result, args.out)
    print((args.out / "step_profile.md").read_text())


if __name__ == "__main__":
    main()
