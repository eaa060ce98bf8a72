"""All of it at once: `inspect_stream` records a stream, runs every measurement that applies to
each layer, and `Inspection.summary` reduces them to the few JSON-able numbers behind the
pictures (`inftyformer inspect`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._progress import progress as show_progress
from ..native.model import MemoryLM
from .fidelity import (
    DEFAULT_AGES,
    Fidelity,
    compressed_fidelity,
    memory_fidelity,
)
from .reads import (
    ReadMap,
    SampleHistory,
    mu_spread,
    mu_values,
    read_map,
    sample_history,
    sigma_values,
)
from .record import record_stream


@dataclass
class Inspection:
    """Everything `inspect_stream` measured (per layer; None where it does not apply)."""

    model_type: str
    num_tokens: int
    segment_len: int
    sigma_0: float | None
    sticky: bool
    tau: float | None  # τ and M of the long-term memory (∞-former)
    num_samples: int | None
    reads: list[ReadMap | None]
    sigmas: list[torch.Tensor | None]  # [H, n] per layer
    mus: list[torch.Tensor | None]
    # μ's spread across the queries of a head, averaged over the reads (the trainer's
    # density/L{i}/mu_spread: ≈ 0 when every query reads the same place)
    mu_spreads: list[float | None]
    samples: list[SampleHistory | None]
    fidelity: list[Fidelity | None]
    compressed: list[Fidelity | None]
    pooled_reference: list[float | None]

    def summary(self) -> dict[str, Any]:
        """The few numbers that summarise the pictures (JSON-able)."""

        def quantiles(x: torch.Tensor) -> dict[str, float]:
            q = torch.quantile(
                x.double().flatten(), torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9], dtype=torch.float64)
            )
            return dict(zip(("p10", "p25", "median", "p75", "p90"), map(float, q), strict=True))

        layers = []
        for i in range(len(self.reads)):
            entry: dict[str, Any] = {"layer": i}
            if self.sigmas[i] is not None:
                s = self.sigmas[i]
                entry["sigma"] = quantiles(s)
                entry["sigma_median_per_head"] = [float(v) for v in s.median(dim=1).values]
                entry["mu"] = quantiles(self.mus[i])
                entry["mu_spread"] = self.mu_spreads[i]
                if self.sigma_0 is not None:
                    entry["fraction_sigma_below_2_sigma0"] = float(
                        (s < 2 * self.sigma_0).double().mean()
                    )
            if self.reads[i] is not None:
                r = self.reads[i]
                entry["read_mass_outside"] = float(r.outside.mean())
                entry["read_mean_distance_tokens"] = float(r.mean_distance.mean())
                entry["read_mass_first_segment"] = float(r.first_segment.mean())
            if self.samples[i] is not None and self.sticky:
                h = self.samples[i].t_hist.double().clamp(min=1e-12)
                entropy = -(h * h.log()).sum(-1) / math.log(h.shape[-1])
                entry["sample_entropy_vs_uniform"] = float(entropy.mean())
                entry["samples_on_first_segment"] = float(self.samples[i].first_segment.mean())
            for name, fid in (
                ("fidelity", self.fidelity[i]),
                ("compressed_fidelity", self.compressed[i]),
            ):
                if fid is not None:
                    entry[name] = {str(a): fid.at(a) for a in fid.ages}
                    # the oldest age (of those measured) up to which every age keeps half of
                    # what is specific to the vectors (centred cosine ≥ 0.5)
                    horizon = None
                    for a, c in zip(fid.ages, fid.centred_cosine, strict=True):
                        if math.isnan(c) or c < 0.5:
                            break
                        horizon = a
                    entry[name + "_horizon"] = horizon
                    entry[name + "_mean_baseline"] = {
                        "cosine": fid.baseline_cosine,
                        "rel_error": fid.baseline_rel_error,
                    }
            if self.pooled_reference[i] is not None:
                entry["compressed_pooled_reference_cosine"] = self.pooled_reference[i]
            layers.append(entry)
        return {
            "model_type": self.model_type,
            "num_tokens": self.num_tokens,
            "segment_len": self.segment_len,
            "segments": math.ceil(self.num_tokens / self.segment_len),
            "sigma_0": self.sigma_0,
            "sticky": self.sticky,
            "tau": self.tau,
            "num_samples": self.num_samples,
            # a vector entering at t ≥ τ falls below the first sample point 1/M after this many
            # updates without sticky memories (τᵏ < 1/M); beyond it the old signal there is
            # never sampled again
            "first_sample_horizon": None
            if self.tau is None
            else math.log(self.num_samples) / math.log(1 / self.tau),
            "layers": layers,
        }


def inspect_stream(
    model: MemoryLM,
    tokens: torch.Tensor,
    ages: Sequence[int] = DEFAULT_AGES,
    bins: int = 256,
    per_block: int | None = 32,
    progress: bool = False,
) -> Inspection:
    """Stream `tokens` [batch, T] through `model` and measure everything the module docstring
    lists, per layer. `progress`: bars over the stream's segments, then over the layers."""
    c = model.config
    if c.has_long_term and c.long_term.squeeze.kind != "fixed":
        raise ValueError(
            "inspection maps the memory's positions to stream ages with a fixed τ; "
            f"squeeze={c.long_term.squeeze.kind!r} is not supported"
        )
    record = record_stream(model, tokens, progress)
    L = c.n_layers
    none = [None] * L
    out = Inspection(
        model_type=c.model_type,
        num_tokens=record.num_tokens,
        segment_len=record.segment_len,
        sigma_0=c.long_term.sigma_0 if c.has_long_term else None,
        sticky=c.has_long_term and c.long_term.sticky,
        tau=c.long_term.tau if c.has_long_term else None,
        num_samples=c.long_term.num_samples if c.has_long_term else None,
        reads=list(none),
        sigmas=list(none),
        mus=list(none),
        mu_spreads=list(none),
        samples=list(none),
        fidelity=list(none),
        compressed=list(none),
        pooled_reference=list(none),
    )
    layers = show_progress(
        list(enumerate(model.blocks)), desc="measuring", unit=" layers", enabled=progress
    )
    for i, block in layers:
        rec = record.layers[i]
        if block.long_term_memory is not None:
            if rec.reads:
                out.reads[i] = read_map(record, i, c.long_term.tau, bins)
                out.sigmas[i] = sigma_values(record, i)
                out.mus[i] = mu_values(record, i)
                out.mu_spreads[i] = mu_spread(record, i)
            if any(s is not None for _, _, s in rec.updates):
                out.samples[i] = sample_history(record, i, c.long_term.tau)
            if rec.updates:
                basis = block.long_term_memory.basis
                tau = c.long_term.tau
                out.fidelity[i] = memory_fidelity(record, i, basis, tau, ages, per_block)
        if block.compressive is not None and rec.compressions:
            fid, ref = compressed_fidelity(record, i, c.compression_rate, c.compressed_len, ages)
            out.compressed[i], out.pooled_reference[i] = fid, ref
    return out
