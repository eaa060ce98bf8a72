"""How much of a pass key the long-term memory still holds: the digits decoded from the memory's
signal at the key's own tokens, against the same decoder on the states that went in.

A ceiling for every read, trained or not: the reads of `experiments/passkey.py` can land on the key
(density = content) and still not answer it, so this asks whether the answer is there at all.
For each pass-key prompt of the facts task's test facts (five digits, d tokens before the
question), the frozen base runs block by block with its window, exactly as the memory model feeds
its memory (`inftyformer.hf`: each block stores its normalised attention input at block ℓ once it
has left the window), and a `LongTermMemory` of each setting is fitted on those blocks. Then, at
the key's tokens t_j (`tasks.facts.read_targets`, the place the read supervision points at):

    states   the stored vectors x_j themselves (what a read at token resolution could give)
    N, w     the memory's signal x̄(t_j) = Bᵀ ψ(t_j), for each setting
    read σ²  the continuous read centred on t_j with that variance, E_p[x̄(t)] (the floor
             `min_sigma_sq` keeps every read at least this wide)

A linear probe (multinomial logistic regression, standardised inputs, L2) is trained on the
digits of half of the keys and tested on the other half: digit accuracy, and the share of keys
with all five digits right. Writes docs/probe_resolution.{json,md}.

    python experiments/probe_resolution.py                  # SmolLM2, block 15, d = 700, 1500, 4000
    python experiments/probe_resolution.py --quick          # a tiny random model, seconds
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import experiment as ex

NAME = "probe_resolution"
# N:widths:σ² (0: the signal at the token itself; else a read of that width, 1e-4 the default
# floor of σ²); the paper's GPT-2 memory first
TAU, RIDGE_LAMBDA = 0.5, 0.5  # the paper's GPT-2 memory (§4.2)
SETTINGS = ";".join(
    [
        "512:0.005,0.01:0",
        "512:0.005,0.01:1e-4",
        "512:0.005,0.01:1e-5",
        "2048:0.00125,0.0025:0",
        "2048:0.00125,0.0025:1e-6",
    ]
)


class _Stop(Exception):
    """Raised by the hook once block ℓ's input is captured: the blocks above it are not run."""


def stored_blocks(base, ids, layer: int, C: int, W: int):
    """What the memory model stores at block `layer`: for each block of C tokens, its normalised
    attention input computed with the W tokens before it as context, [K, C, e] each."""
    import torch

    from inftyformer.hf.adapters import adapter_for

    adapter = adapter_for(type(base).__name__)
    norm = adapter.attention_inputs(base)[layer]
    captured = []

    def hook(module, args, output):
        captured.append(output.detach())
        raise _Stop

    handle = norm.register_forward_hook(hook)
    blocks = []
    try:
        with torch.no_grad():
            for a in range(0, ids.shape[1], C):
                ctx = max(0, a - W)
                try:
                    base(ids[:, ctx : a + C])
                except _Stop:
                    pass
                blocks.append(captured.pop()[:, a - ctx :])
    finally:
        handle.remove()
    return blocks


def memory_reads(blocks, t, C: int, W: int, N: int, widths: tuple, sigma_sqs: list[float]):
    """The memory of one (N, widths) fitted on the blocks it holds when the last block is read,
    then read at the places t [K, D] of the key's tokens: σ² → [K, D, e], σ² = 0 the signal
    itself x̄(t), σ² > 0 the continuous read E_p[x̄(t)] of p = 𝒩(t, σ²)."""
    import torch

    from inftyformer import LongTermConfig, LongTermMemory
    from inftyformer.core.continuous_softmax import continuous_softmax
    from inftyformer.tasks.facts import fitted_blocks

    e = blocks[0].shape[-1]
    config = LongTermConfig(dim=e, num_heads=1, num_basis=N, widths=widths, tau=TAU,
                            ridge_lambda=RIDGE_LAMBDA, num_samples=N, conv_gate=False)  # fmt: skip
    memory = LongTermMemory(config).eval()  # evaluation sampling, as when reading
    state = memory.init_state(blocks[0].shape[0])
    t = t.float()
    out = {}
    with torch.no_grad():
        for block in blocks[: fitted_blocks(len(blocks) * C, C, W)]:
            state = memory.update(state, block.float())
        for sigma_sq in sigma_sqs:
            if sigma_sq:  # a read of width σ at t: E_p[ψ] = 𝒩(t; c, σ² + w²)
                psi = continuous_softmax(t, torch.full_like(t, sigma_sq), memory.basis)
            else:  # the signal itself at t
                psi = memory.basis(t)  # [K, D, N]
            out[sigma_sq] = torch.einsum("kdn,kne->kde", psi, state.coefficients.float())
    return out


def probe(x, labels, seed: int = 0) -> dict[str, float]:
    """Logistic regression on the first half of the keys, tested on the second: x [K, D, e],
    labels [K, D] (token ids). Digit accuracy and the share of keys with every digit right."""
    import torch

    K = x.shape[0]
    train, test = slice(0, K // 2), slice(K // 2, K)
    classes, y = torch.unique(labels, return_inverse=True)
    fit = x[train].double().flatten(0, 1)  # standardised on the training keys
    z = (x.double() - fit.mean(0)) / (fit.std(0) + 1e-6)
    torch.manual_seed(seed)
    weight = torch.zeros(z.shape[-1], len(classes), dtype=torch.float64, requires_grad=True)
    bias = torch.zeros(len(classes), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([weight, bias], max_iter=300, line_search_fn="strong_wolfe")
    xt, yt = z[train].flatten(0, 1), y[train].flatten()

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xt @ weight + bias, yt)
        loss = loss + 1e-2 * weight.square().sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        hit = (z[test] @ weight + bias).argmax(-1) == y[test]  # [K/2, D]
    return {"digit_accuracy": hit.double().mean().item(),
            "key_exact": hit.all(-1).double().mean().item(), "test_keys": K - K // 2}  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from passkey import passkey_prompts
    from transformers import AutoModelForCausalLM

    from inftyformer.tasks.facts import read_targets

    base = AutoModelForCausalLM.from_pretrained(args.base_model, dtype=torch.float32).eval()
    settings: dict[tuple, list[float]] = {}  # (N, widths) → read widths: one fit each
    for n, ws, v in (s.split(":") for s in args.settings.split(";")):
        settings.setdefault((int(n), tuple(float(w) for w in ws.split(","))), []).append(float(v))
    C, W = args.segment_len, args.window
    results: dict[str, Any] = {}
    for d, (inputs, answer, key_at) in passkey_prompts(args).items():
        start = time.perf_counter()
        digits = int((answer != -100).sum(1).min())
        blocks = stored_blocks(base, inputs, args.layer, C, W)
        tokens = key_at[:, None] + torch.arange(digits)  # the key's tokens  [K, D]
        rows = torch.arange(len(key_at))[:, None]
        labels, states = inputs[rows, tokens], torch.cat(blocks, 1)[rows, tokens]
        t, known = read_targets(tokens, inputs.shape[1], C, W, TAU)  # [K, D]
        if not bool(known.all()):
            raise SystemExit(f"a key token is not in the memory (d too small for W = {W})")
        row = {"states": probe(states, labels)}
        for (N, widths), sigma_sqs in settings.items():
            reads = memory_reads(blocks, t, C, W, N, widths, sigma_sqs)
            for sigma_sq, x in reads.items():
                read = f", read σ²={sigma_sq:g}" if sigma_sq else ""
                row[f"N={N}, widths={list(widths)}{read}"] = probe(x, labels)
        row["seconds"] = time.perf_counter() - start
        results[str(d)] = row
        print(f"d={d}: " + ", ".join(f"{k} {v['digit_accuracy']:.2f}" for k, v in row.items()
                                     if isinstance(v, dict)), flush=True)  # fmt: skip
    return results


def render(data: dict[str, Any], out_dir: Path) -> None:
    setup, results = data["setup"], data["results"]
    columns = [k for k in next(iter(results.values())) if k != "seconds"]
    body = [[f"d = {d}", *(f"{row[c]['digit_accuracy']:.2f} ({row[c]['key_exact']:.2f})"
                           for c in columns)] for d, row in results.items()]  # fmt: skip
    keys = next(iter(results.values()))["states"]["test_keys"]
    lines = ["# What the memory still holds of a pass key", "",
             f"Base `{setup['base_model']}`, block {setup['layer']}, blocks of C = "
             f"{setup['segment_len']} with a window of W = {setup['window']}, "
             f"λ = {RIDGE_LAMBDA}, τ = {TAU}, "
             f"M = N, no CNN gate; a linear probe trained on the digits of {setup['keys'] - keys} "
             f"keys, tested on {keys}. Cells: digit accuracy (share of keys with all digits "
             "right); chance 0.10. Rendered from "
             f"`{NAME}.json` by `benchmarks/{NAME}.py`.", "",
             ex.table(["distance", "the stored states", *columns[1:]], body), "",
             ex.hand_notes(out_dir / f"{NAME}.md"), ""]  # fmt: skip
    (out_dir / f"{NAME}.md").write_text("\n".join(lines), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    from passkey import add_prompt_arguments, prompt_setup

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_prompt_arguments(p, distances="700,1500,4000", keys=40)
    p.add_argument("--layer", type=int, default=15)
    p.add_argument("--settings", default=SETTINGS, help="N:widths:σ²;… (σ² 0: no read width)")
    args = p.parse_args(argv)
    quick = dict(distances="40", keys=6, segment_len=16, window=16, layer=1,
                 settings="32:0.02:0;64:0.01:0;64:0.01:1e-3")  # fmt: skip
    out_dir, setup = prompt_setup(args, quick, extra=("layer", "settings"))
    if args.render_only:
        render(ex.load_report(out_dir / f"{NAME}.json"), out_dir)
        return
    start = time.perf_counter()
    results = measure(args)
    data = ex.report(NAME, setup, {}, {}, [], 1, time.perf_counter() - start)
    data["results"] = results
    ex.write_report(out_dir / f"{NAME}.json", data)
    render(data, out_dir)
    print(f"wrote {out_dir / NAME}.md")


if __name__ == "__main__":
    main()
