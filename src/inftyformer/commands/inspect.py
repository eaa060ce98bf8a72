"""`inftyformer inspect`: stream real input through a saved model, draw what its memory holds
and where its reads go, and print the per-layer summary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from .._files import read_user_text, write_atomic


def run_inspect(
    checkpoint: Path,
    *,
    text: Path | None,
    split: str,
    segments: int,
    out: Path | None,
    device: str,
    base_model: str | None,
) -> None:
    """Inspect `checkpoint` (see `inftyformer inspect --help`)."""
    from ..inspection import inspect_stream
    from ..inspection_plots import draw_all
    from ..training import load_run

    if segments < 1:
        raise ValueError(f"--segments must be >= 1, got {segments}")
    own_text = read_user_text(text, "--text") if text is not None else None
    run = load_run(checkpoint, device, base_model=base_model)
    task = run.task(batch_size=1)
    length = segments * run.model_config.segment_len
    if own_text is not None:
        tokens = task.encode_prompt(own_text)[0][:length]
    else:
        tokens = task.inspection_stream(split, length)
    start = time.perf_counter()
    typer.echo(f"streaming {len(tokens):,} tokens through the model, then measuring its memory")
    result = inspect_stream(run.model, tokens[None].to(run.device), progress=True)
    out_dir = out or (checkpoint if checkpoint.is_dir() else checkpoint.parent) / "inspect"
    summary = result.summary()
    summary["source"] = str(text) if text is not None else f"{split} split"
    typer.echo(f"drawing the pictures into {out_dir}")
    paths = draw_all(result, out_dir)
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
    typer.echo(f"{len(tokens):,} tokens in {time.perf_counter() - start:.1f} s -> {out_dir}")
    for layer in summary["layers"]:
        parts = [f"layer {layer['layer']}"]
        if "sigma" in layer:
            parts.append(f"median sigma {layer['sigma']['median']:#.3g}")
            parts.append(f"mu spread across queries {layer['mu_spread']:#.3g}")
        for key in ("fidelity", "compressed_fidelity"):
            for age in ("1", "10", "100"):
                if age in layer.get(key, {}):
                    parts.append(f"{key} cos k={age} {layer[key][age]['cosine']:.3f}")
        typer.echo("  " + ", ".join(parts))
    for path in paths:
        typer.echo(f"  wrote {path}")
