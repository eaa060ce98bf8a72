"""What the memory holds and where the reads go: measurements over a model streaming real input.

Everything here is a pure function of a model and a token stream (or of what was recorded while
streaming); nothing draws (`inspection_plots.py` draws, the `inftyformer inspect` command calls
both). One stream of tokens [batch, T] goes through the model in calls of C = `segment_len`
tokens from a fresh memory, in evaluation mode (sticky memories then resample at deterministic
quantiles), with `MemoryLM.forward(..., return_trace=True)`:

* `record_stream`: per call and layer, the long-term reads' μ, σ² [batch, H, C], the long-term
  updates (vectors stored, where the old signal was sampled) and the coefficients B after the
  call; for the compressive model the states compressed and their slots.

Where things sit in the continuous memory (`position_history`). Block j of the stream (tokens
jC .. jC + C − 1) enters a layer's long-term memory as its j-th update (calls never cross block
boundaries and there are no resets, so that holds exactly). A first fit places its vectors at
(i + ½)/C. Every later update samples the old signal at u_1 < … < u_M and refits those values at
τ·i/M, then places the new block at τ + (1 − τ)(i + ½)/C. So a stored vector at t moves to

    φ(t) = τ · P̂(t),   P̂ the piecewise-linear map through (u_i, i/M).

Content before the first sample or after the last one is not resampled at all: it is lost, and
φ puts it on the nearest sample (τ/M or τ), where the new signal holds that sample's value.
Without sticky memories u_i = i/M, so φ(t) = τt for t ≥ 1/M: after k updates a vector stored at
t sits at τᵏt, until τᵏt < 1/M, after ≈ ln M / ln(1/τ) updates for a new vector; from then on
it has collapsed onto τ/M with everything older (the "first-sample horizon"). With sticky
memories the samples crowd where the queries attended, so those regions keep more of [0, τ]
(P̂ is steep there) and the others are squeezed harder or dropped.

* `origin_history`: the other way round, which stream position the signal at each t holds
  (composing the inverse maps); it also covers what no stored vector marks any more.
* `read_map`: each query's density 𝒩(μ, σ²) over t, mapped back to absolute positions of the
  past through the origin map. Mass outside [0, 1] reads nothing stored and is reported apart.
* `sigma_values`: σ = √σ² of every read, per layer and head (the KL prior is σ₀).
* `sample_history`: where each update's resampling points u went, over [0, 1] and mapped back to
  absolute positions (sticky memories).
* `memory_fidelity`: for vectors that entered the memory k updates ago, the cosine and the
  relative error ‖x̄(t) − x‖/‖x‖ between the stored vector x (as fitted: after the CNN gate) and
  the signal x̄(t) = Bᵀψ(t) read back at its current position t. k = 0 measures the fit alone;
  larger k what the squeezes and refits leave.
* `compressed_fidelity`: the Compressive Transformer's analogue: the cosine and relative error
  between each state and the slot that replaced it (both through a LayerNorm without parameters,
  as the attention sees them up to its affine part), while the slot is kept; a slot that fell
  out of the n_cm kept ones holds nothing (reported as the fraction still present).
"""

from __future__ import annotations

from .fidelity import (
    DEFAULT_AGES,
    Fidelity,
    compressed_fidelity,
    memory_fidelity,
    signal_fidelity,
)
from .positions import block_positions, origin_history, position_history, squeeze_positions
from .reads import (
    ReadMap,
    SampleHistory,
    mu_spread,
    mu_values,
    read_map,
    sample_history,
    sigma_values,
)
from .record import LayerRecord, StreamRecord, record_stream
from .summary import Inspection, inspect_stream

__all__ = [
    "DEFAULT_AGES",
    "Fidelity",
    "Inspection",
    "LayerRecord",
    "ReadMap",
    "SampleHistory",
    "StreamRecord",
    "block_positions",
    "origin_history",
    "compressed_fidelity",
    "inspect_stream",
    "memory_fidelity",
    "mu_spread",
    "mu_values",
    "position_history",
    "read_map",
    "record_stream",
    "sample_history",
    "sigma_values",
    "signal_fidelity",
    "squeeze_positions",
]
