"""How one forward call travels through the library: the Python calls into inftyformer's own
functions during one `model(ids, state=...)` of a tiny random Llama with the retrieval settings
(the base's heads reading a fill memory of exact places at their ranks, salient places kept),
counted with `sys.setprofile`:

    calls    function calls whose code lives in the inftyformer package
    modules  distinct inftyformer modules entered
    hops     calls from one inftyformer module into another (a call within a module is no hop)
    returns  the most times one module was re-entered from another

    python scripts/trace_call.py            # the table for this checkout
    python scripts/trace_call.py --json F   # also the counts as JSON

The memory is first filled past its places (so the call reads and writes a full memory); only
the last call is traced. Runs on the code before the redesign too (settings written flat).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hf"))

# the retrieval settings at a tiny scale (the preset's kinds, small numbers)
SETTINGS = dict(
    memory_read="heads", memory_positions="ranks", density="mixture", sharpness=1.0,
    sink_edge=0.0, min_sigma_sq=1e-6, num_basis=32, widths=(0.003,), squeeze="fill",
    edge_padding=False, keep_first=2, keep_last=8, keep_salient=12, salient_before=2,
    segment_len=8, window=8,
)  # fmt: skip


def settings() -> dict:
    """`SETTINGS`, plus num_samples = K where the code still wants it for squeeze='fill'."""
    import dataclasses

    try:
        from inftyformer.core.config import LongTermConfig
    except ImportError:  # before core/
        from inftyformer.long_term_config import LongTermConfig
    names = {f.name for f in dataclasses.fields(LongTermConfig)}
    return {**SETTINGS, "num_samples": 32} if "num_samples" in names else dict(SETTINGS)


def trace(model, ids, state) -> dict:
    calls, hops = 0, 0
    modules: collections.Counter = collections.Counter()
    entries: collections.Counter = collections.Counter()

    def module_of(frame) -> str | None:
        name = frame.f_globals.get("__name__", "")
        return name if name.startswith("inftyformer") else None

    def profile(frame, event, arg):
        nonlocal calls, hops
        if event != "call":
            return
        here = module_of(frame)
        if here is None:
            return
        calls += 1
        modules[here] += 1
        caller = frame.f_back
        while caller is not None and module_of(caller) is None:
            caller = caller.f_back  # through torch and transformers to the library's caller
        there = None if caller is None else module_of(caller)
        if there is not None and there != here:
            hops += 1
            entries[here] += 1

    sys.setprofile(profile)
    try:
        model(ids, state=state)
    finally:
        sys.setprofile(None)
    most = entries.most_common(3)
    return {"calls": calls, "modules": len(modules), "hops": hops, "most_entered": most}


def main() -> None:
    import torch
    from tiny_hf import V, tiny_base

    from inftyformer.hf import add_long_term_memory

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    model = add_long_term_memory(tiny_base("llama"), **settings()).eval()
    ids = torch.randint(1, V, (2, 8), generator=torch.Generator().manual_seed(0))
    state = None
    with torch.no_grad():
        for _ in range(8):  # 64 tokens: the 32 places full, merged
            state = model(ids, state=state).state
        counts = trace(model, ids, state)
    shown = ", ".join(f"{name} {n}x" for name, n in counts["most_entered"])
    print(f"calls {counts['calls']}, modules {counts['modules']}, hops {counts['hops']}; "
          f"most entered: {shown}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(counts, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
