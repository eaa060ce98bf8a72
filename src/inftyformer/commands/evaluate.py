"""`inftyformer evaluate`: score a saved run on a split of its data, or on other text, with
the evaluation memory settings given, print its metrics and write them as JSON on request."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer

from .._files import write_atomic
from ..errors import CommandError, check_output_file, os_message


def run_evaluate(
    checkpoint: Path | None,
    split: str,
    batches: int | None,
    device: str,
    *,
    data_dir: str | None,
    settings: list[str],
    batch_size: int | None,
    max_docs: int | None,
    max_tokens: int | None,
    base_model: str | None,
    json_out: Path | None,
    progress: bool,
    preset: str | None = None,
) -> None:
    """Evaluate `checkpoint` (see `inftyformer evaluate --help`); `progress`: show a bar."""
    if checkpoint is None:  # no trained run: the base reads its own past (training-free)
        if base_model is None or data_dir is None or settings:
            raise ValueError(
                "give a checkpoint, or --base-model DIR and --data-dir TEXT to score the text "
                "with the base reading its own past by a retrieval --preset (no --set)"
            )
        return evaluate_by_retrieval(base_model, preset, data_dir, split, max_docs, max_tokens,
                                     json_out, progress)  # fmt: skip
    from ..configure import split_settings, task_settings
    from ..training import evaluate_run, read_configs
    from ..training.config import parse_overrides

    for name, value in (("batches", batches), ("batch-size", batch_size)):
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    to_stdout = json_out is not None and str(json_out) == "-"
    if json_out is not None and not to_stdout:
        check_output_file(json_out, "--json")  # before a long evaluation, not after it
    saved_train, _, saved_model = read_configs(checkpoint, base_model)
    task = saved_train.task
    text = split_settings(settings, task, type(saved_model))
    if text["train"]:
        raise ValueError(f"train settings cannot change at evaluation: {sorted(text['train'])}")
    memory = parse_overrides(type(saved_model), text["model"], "model")
    if preset is not None:  # the preset's settings that differ from the run's, under --set's
        memory = {**preset_memory(preset, saved_model), **memory}
    options = dict(eval_data=data_dir, max_docs=max_docs, max_tokens=max_tokens)
    task_values = task_settings(task, options, text["task"], {"eval_data": "--data-dir"})
    start = time.perf_counter()
    metrics, evaluation, task_obj = evaluate_run(
        checkpoint,
        split,
        batches,
        device,
        memory_settings=memory,
        task_settings=task_values,
        batch_size=batch_size,
        progress=progress,
        base_model=base_model,
    )
    seconds = time.perf_counter() - start
    typer.echo(f"{_evaluated(split, data_dir)} {task_obj.describe(metrics)} ({seconds:.1f} s)")
    typer.echo("  " + ", ".join(f"{k} {task_obj.format_metric(k, v)}" for k, v in metrics.items()))
    if memory:
        typer.echo("  evaluation memory: " + ", ".join(f"{k}={v}" for k, v in memory.items()))
    if json_out is None:
        return
    payload = {
        "checkpoint": str(checkpoint),
        "task": task,
        "split": split,
        "metrics": metrics,
        "sums": evaluation.sums,
        "memory_settings": memory,
        "task_config": task_obj.config.to_dict(),
        "model_config": task_obj.model_config.to_dict(),
        "details": evaluation.details,
    }
    document = json.dumps(payload, indent=1)
    if to_stdout:
        typer.echo(document)
        return
    try:
        write_atomic(json_out, document)
    except OSError as err:
        typer.echo(document)  # the evaluation is not lost
        raise CommandError(
            f"could not write --json {json_out} ({os_message(err, 'choose another path')}); "
            "the result was written to stdout instead"
        ) from err
    typer.echo(f"  wrote {json_out}")


def evaluate_by_retrieval(
    base_model: str,
    preset: str | None,
    data_dir: str,
    split: str,
    max_docs: int | None,
    max_tokens: int | None,
    json_out: Path | None,
    progress: bool,
) -> None:
    """Score the documents of `data_dir` (any layout `--data-dir` reads, every file a document)
    with the base in `base_model` reading its own past by a retrieval preset (default: the
    default preset), as every model is scored (`integrations.lm_eval.evaluate_lm`): each
    document after the tokenizer's end-of-text token, every token scored once, streamed in
    calls of the preset's segment; the loss, perplexity and bits per byte."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..data.corpus import load_split
    from ..data.tokenized import token_byte_lengths, truncate_documents
    from ..data.tokenizer import BPETokenizer
    from ..integrations.lm_eval import LMEvalConfig, evaluate_lm
    from ..presets import retrieval_settings
    from ..retrieval import RetrievalLM

    preset = preset or "retrieval"
    retrieval_settings(preset)  # a named error before any weight is read
    for name, value in (("max-docs", max_docs), ("max-tokens", max_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"--{name} must be >= 1, got {value}")
    tokenizer = BPETokenizer.from_directory(base_model)
    corpus = load_split(data_dir, split, tokenizer, whole=True)
    if max_docs is not None or max_tokens is not None:
        corpus = truncate_documents(corpus, max_tokens, max_docs, token_byte_lengths(tokenizer))
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=torch.float32)
    model = RetrievalLM(base, preset=preset).eval()
    result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=1, progress=progress))
    bits = result.bits_per_byte if result.num_bytes else None
    metrics = {"loss": result.loss, "perplexity": result.perplexity, "bits_per_byte": bits,
               "tokens": result.num_tokens, "documents": result.num_docs}  # fmt: skip
    typer.echo(f"{_evaluated(split, data_dir)} read by preset {preset} ({result.seconds:.1f} s)")
    shown = (f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in metrics.items())
    typer.echo("  " + ", ".join(shown))
    if json_out is not None:
        payload = {"base_model": str(base_model), "preset": preset, "split": split,
                   "settings": model.config.to_dict(), "metrics": metrics}  # fmt: skip
        document = json.dumps(payload, indent=1)
        typer.echo(document) if str(json_out) == "-" else write_atomic(json_out, document)


def preset_memory(preset: str, model_config) -> dict:
    """What preset `preset` changes in a trained model's settings (a ValueError from the
    model's config names any change a trained model cannot take)."""
    from ..model_kinds import model_kind
    from ..presets import preset_changes
    from ..pretrained_config import base_blocks

    kind = model_kind(model_config)
    blocks = base_blocks(model_config.base_model) if kind == "pretrained" else None
    return preset_changes(preset, kind, model_config.to_dict(), blocks)


def _evaluated(split: str, data_dir: str | None) -> str:
    """What was scored, as the result line's label: the split of the run's data ('test'), or
    the text given with --data-dir (its SPLIT/ folder when it has one)."""
    if data_dir is None:
        return split
    if data_dir == "-":
        return "standard input:"
    if (Path(data_dir).expanduser() / split).is_dir():
        return f"{data_dir} ({split}):"
    return f"{data_dir}:"
