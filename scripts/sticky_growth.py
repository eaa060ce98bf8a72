"""Stream segments through a long-term memory with sticky memories whose attention always falls
on one point, the worst case for the unbounded update: each update reads the old signal only
there, so wherever the refit overshoots its data the next update reads the overshoot.

The adversary puts all of a row's attention on the bin where the stored signal is largest in
absolute value (over every channel), before every update. Prints JSON: per setting, the largest
|coefficient| after the first update and after the last one, and the largest over the stream.

    python scripts/sticky_growth.py                    # 200 segments, the settings below
    python scripts/sticky_growth.py --segments 50 --out growth.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from inftyformer import LongTermConfig, LongTermMemory

# (name, LongTermConfig settings, segment length L)
SETTINGS = [
    (
        "N=M=64, widths (0.01, 0.05), λ=1, τ=0.75, L=64",
        dict(num_basis=64, num_samples=64, widths=(0.01, 0.05), ridge_lambda=1.0, tau=0.75),
        64,
    ),
    (
        "N=M=64, widths (0.005, 0.01), λ=0.5, τ=0.5, L=64",
        dict(num_basis=64, num_samples=64, widths=(0.005, 0.01), ridge_lambda=0.5, tau=0.5),
        64,
    ),
    (
        "N=M=512, widths (0.005, 0.01), λ=0.5, τ=0.5, L=512 (the paper's GPT-2 settings)",
        dict(num_basis=512, num_samples=512, widths=(0.005, 0.01), ridge_lambda=0.5, tau=0.5),
        512,
    ),
]


def stream(settings: dict, length: int, segments: int, training: bool, seed: int = 0) -> dict:
    config = LongTermConfig(dim=4, num_heads=1, conv_gate=False, sticky=True, **settings)
    memory = LongTermMemory(config).train(training)
    g = torch.Generator().manual_seed(seed)
    grid = torch.linspace(0, 1, 4 * config.sticky_bins + 1, dtype=torch.float64)
    state = memory.init_state(2, dtype=torch.float64)
    peaks = []
    with torch.no_grad():
        for _ in range(segments):
            if not bool(state.empty.all()):
                signal = memory.signal(state, grid).abs().amax(-1)  # [batch, T]
                where = grid[signal.argmax(-1)]  # the largest value of each row
                bins = (where * config.sticky_bins).long().clamp(max=config.sticky_bins - 1)
                mass = torch.nn.functional.one_hot(bins, config.sticky_bins).to(torch.float64)
                state = replace(state, attention_mass=mass)
            x = torch.randn(2, length, config.dim, generator=g, dtype=torch.float64)
            state = memory.update(state, x, g)
            peaks.append(float(state.coefficients.abs().max()))
    return {"first": peaks[0], "last": peaks[-1], "largest": max(peaks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=200)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    results = []
    for name, settings, length in SETTINGS:
        for training in (False, True):
            row = stream(settings, length, args.segments, training)
            results.append({"settings": name, "training": training, **row})
    text = json.dumps({"segments": args.segments, "results": results}, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
