"""A short demonstration of the continuous long-term memory: stream a long random-walk signal
into `LongTermMemory` segment by segment and read it back.

After k updates a segment that arrived a updates ago lives at t ∈ τ^a · (τ, 1]: each update squeezes
the old signal by τ. Reading x̄(t) there and comparing with the original shows how detail fades
with age, while the memory stays N×e numbers however long the stream was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ._checks import check_positive_int
from .core.memory import LongTermConfig, LongTermMemory

MAX_DEMO_VALUES = 1 << 28  # the random walk is built in memory: 2 GiB of float64 at most


@dataclass
class DemoResult:
    history: int  # tokens streamed
    memory_floats: int  # N·e per row
    seconds_per_update: float
    error_by_age: list[tuple[int, float]]  # (age in segments, relative RMS error)


def random_walk(length: int, dim: int, scale: float, generator: torch.Generator) -> torch.Tensor:
    """A mean-reverting random walk (Ornstein–Uhlenbeck) with unit variance that forgets its past
    over about `scale` steps: x_{t+1} = a x_t + √(1 − a²) ε_t, a = exp(−1/scale). [length, dim]"""
    a = torch.exp(torch.tensor(-1.0 / scale, dtype=torch.float64))
    noise = torch.randn(length, dim, generator=generator, dtype=torch.float64) * (1 - a * a).sqrt()
    noise[0] = torch.randn(dim, generator=generator, dtype=torch.float64)
    # x_t = Σ_{s≤t} a^{t−s} ε_s, blockwise as a linear filter (no Python loop per step)
    x = torch.empty_like(noise)
    block = 256
    powers = a ** torch.arange(block, dtype=torch.float64)  # [block]
    kernel = torch.tril(powers[:, None].div(powers[None, :]))  # a^{i−j} for i ≥ j  [block, block]
    carry = torch.zeros(dim, dtype=torch.float64)
    for start in range(0, length, block):
        chunk = noise[start : start + block]
        n = chunk.shape[0]
        x[start : start + n] = kernel[:n, :n] @ chunk + powers[:n, None] * a * carry
        carry = x[start + n - 1]
    return x.float()


@torch.no_grad()
def run_demo(
    length: int = 65_536,
    segment_len: int = 512,
    num_basis: int = 256,
    dim: int = 16,
    tau: float = 0.75,
    num_samples: int = 512,
    seed: int = 0,
    ages: int = 6,
) -> DemoResult:
    for name, value in (
        ("length", length),
        ("segment_len", segment_len),
        ("num_basis", num_basis),
        ("dim", dim),
        ("num_samples", num_samples),
    ):
        check_positive_int(name, value)
    check_positive_int("seed", seed, minimum=0)
    check_positive_int("ages", ages, minimum=0)
    if length < segment_len:
        raise ValueError(f"length ({length}) must be at least segment_len ({segment_len})")
    if length * dim > MAX_DEMO_VALUES:
        raise ValueError(
            f"length × dim = {length * dim:,} values is more than the demo streams "
            f"({MAX_DEMO_VALUES:,}); use a shorter --length"
        )
    g = torch.Generator().manual_seed(seed)
    config = LongTermConfig(
        dim=dim,
        num_heads=1,
        num_basis=num_basis,
        tau=tau,
        num_samples=num_samples,
        conv_gate=False,
        segment_len=segment_len,  # settings whose update expands are refused here
    )
    memory = LongTermMemory(config).eval()
    signal = random_walk(length, dim, segment_len / 4, g)  # [T, e]
    segments = signal[: length - length % segment_len].view(-1, segment_len, dim)
    state = memory.init_state(1)
    start = time.perf_counter()
    for seg in segments:
        state = memory.update(state, seg[None])
    per_update = (time.perf_counter() - start) / len(segments)

    errors = []
    i = torch.arange(segment_len, dtype=torch.float64)
    newest = tau + (1 - tau) * (i + 0.5) / segment_len  # where the last segment was placed
    for age in range(min(ages, len(segments))):
        t = (tau**age) * newest  # squeezed by τ once per later update
        recon = memory.signal(state, t.float())[0]  # [L, e]
        truth = segments[len(segments) - 1 - age]
        rel = (recon - truth).pow(2).mean().sqrt() / truth.pow(2).mean().sqrt()
        errors.append((age, float(rel)))
    return DemoResult(
        history=segments.numel() // dim,
        memory_floats=num_basis * dim,
        seconds_per_update=per_update,
        error_by_age=errors,
    )


def format_demo(result: DemoResult) -> str:
    lines = [
        f"streamed {result.history:,} steps of a random walk "
        f"into a memory of {result.memory_floats:,} floats per row",
        f"time per update: {result.seconds_per_update * 1e3:.2f} ms",
        "segment age  relative RMS reconstruction error",
    ]
    lines += [f"{age:>11d}  {err:.3f}" for age, err in result.error_by_age]
    return "\n".join(lines)
