"""lm-evaluation-harness (`lm_eval`, 0.4.x) on local text: a task folder for `--include_path`
whose task scores whole documents with `loglikelihood_rolling` (word perplexity, byte
perplexity, bits per byte), read straight from the text files (nothing copied, nothing
downloaded), and the command that evaluates a saved memory model on it (`docs/hf.md`):

    python -m inftyformer.integrations.harness TASK_DIR --data-dir DATA [--split test]
        [--max-docs N] [--max-chars N] [--model MODEL_DIR]

DATA is any text layout `inftyformer evaluate --data-dir` reads from files (a corpus with
SPLIT/*.txt such as pg19-mini, a data root holding pg19-mini/, a flat folder of .txt files, one
.txt file); default: the shared data directory, else the embedded novels. The task lists the
documents' absolute paths (Hugging Face `datasets`' "text" loader, one file = one document);
`--max-chars N` scores the first N characters of each.

How it matches the library's own evaluation (`inftyformer evaluate`, `integrations/lm_eval.py`):
lm_eval puts `prefix_token_id` before each document and scores every token after it. The
printed command sets it to the id the library puts there (the tokenizer's `<|endoftext|>`,
else its end-of-sequence token), and `max_length` above any document's length, so that each
document reaches the model in one call, which streams it through the memory segment by segment
(`segments.py`); the summed log-likelihood is then the library's. With a smaller max_length,
lm_eval cuts documents into rolling windows (its term: pieces of that many tokens) and the
memory starts empty in each.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from .._files import write_atomic
from ..data.corpus import _split_files, split_flat_folder, text_layout
from ..data.paths import SPLITS, training_source

TASK = "inftyformer_text"  # the task's default name
MAX_LENGTH = 1 << 24  # tokens: above any document, so that lm_eval passes each one whole
METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
# a task's name: a file name in the task folder (NAME.yaml) and lm_eval's --tasks entry
TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
# what lm_eval's key=value parsing of --model_args gives a meaning: a comma starts another
# argument; quotes and brackets group (0.4.9 and later); and a value that reads as a number,
# a bool or a Python literal is converted
MODEL_ARGS_SYNTAX = re.compile(r"[,\s'\"\[\](){}]")


def check_task_name(name: object) -> str:
    """`name` as a task's name: letters, digits, `_`, `.` and `-`, not starting with `.` or
    `-` (no path: `../x`, an absolute path or an empty name would write outside the task
    folder, or name no task)."""
    if not isinstance(name, str) or not TASK_NAME.fullmatch(name):
        raise ValueError(
            f"the task's name must be 1 to 100 letters, digits, '_', '.' or '-', starting with "
            f"a letter, a digit or '_' (it names NAME.yaml in the task folder), got {name!r}"
        )
    return name


def check_model_dir(model_dir: str | Path) -> str:
    """`model_dir` as lm_eval's `pretrained=` value, refused (ValueError) where lm_eval's
    `--model_args key=value,...` would read it as something else: a comma (it would start
    another argument, e.g. `trust_remote_code=...` or `pretrained=` of another folder),
    whitespace, quotes or brackets, or a value lm_eval converts (a number, true/false, a
    literal)."""
    text = str(model_dir)
    converted = False
    if text.lower() in ("true", "false", "none") or text.isnumeric():
        converted = True
    else:
        try:
            float(text)
            converted = True
        except ValueError:
            pass
    if not text or converted or MODEL_ARGS_SYNTAX.search(text):
        raise ValueError(
            f"the model folder {text!r} cannot be passed in lm_eval's --model_args "
            "(key=value pairs split at commas; quotes, brackets and whitespace group, numbers "
            "and true/false are converted): move or link the folder to a path of letters, "
            "digits and / . _ - (e.g. ln -s 'OLD' models/mine)"
        )
    return text


def document_files(data_dir: str | Path | None, split: str = "test") -> list[Path]:
    """The text files (one document each, sorted by name) of `split` in `data_dir` (None: the
    shared data directory, else the embedded corpus), as `inftyformer evaluate --data-dir`
    finds them."""
    source = training_source(None) if data_dir is None else Path(data_dir).expanduser()
    layout, root = text_layout(source, split)
    if layout == "file":
        return [root.resolve()]
    if layout == "corpus":
        return [p.resolve() for p in _split_files(root, split)]
    if layout == "flat":
        files = sorted(p for p in root.glob("*.txt") if p.is_file())
        return [p.resolve() for p in split_flat_folder(files)[split]]
    raise ValueError(f"{source}: {layout} text is not a folder of documents the task can list")


def write_task(
    task_dir: str | Path,
    data_dir: str | Path | None = None,
    split: str = "test",
    max_docs: int | None = None,
    max_chars: int | None = None,
    name: str = TASK,
) -> Path:
    """Write the task `name` (`TASK_DIR/NAME.yaml`) over the documents of `split` in
    `data_dir` (the first `max_docs`; the first `max_chars` characters of each); returns it."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    check_task_name(name)
    for option, value in (("max_docs", max_docs), ("max_chars", max_chars)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{option} must be a positive int or None, got {value!r}")
        if value is not None and value < 1:
            raise ValueError(f"{option} must be a positive int or None, got {value!r}")
    files = document_files(data_dir, split)[:max_docs]
    target = "{{text}}" if max_chars is None else f"{{{{text[:{max_chars}]}}}}"
    task = {
        "task": name,
        "dataset_path": "text",
        "dataset_kwargs": {"data_files": {split: [str(p) for p in files]}, "sample_by": "document"},
        "test_split": split,
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": target,
        "metric_list": [{"metric": m} for m in METRICS],
        "metadata": {"version": 1.0},
    }
    folder = Path(task_dir).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    write_atomic(path, json.dumps(task, indent=1) + "\n")  # JSON is YAML
    return path


def prefix_token_id(model_dir: str | Path) -> int:
    """The id the library puts before each document (`integrations/lm_eval.py`): the model folder's
    `<|endoftext|>`, else its end-of-sequence token."""
    from ..data.tokenizer import BPETokenizer

    return BPETokenizer.from_directory(model_dir).eos_id


def model_args(model_dir: str | Path, max_length: int = MAX_LENGTH) -> str:
    """lm_eval's `--model_args` for a saved memory model (`save_pretrained`, tokenizer beside
    it): loaded through the folder's own loader module, each document whole. A folder whose
    path lm_eval would read as more than a path is refused (`check_model_dir`)."""
    model_dir = check_model_dir(model_dir)
    return (
        f"pretrained={model_dir},trust_remote_code=True,"
        f"prefix_token_id={prefix_token_id(model_dir)},max_length={max_length}"
    )


def command(model_dir: str | Path, task_dir: str | Path, name: str = TASK) -> list[str]:
    """The `lm_eval` command line that evaluates `model_dir` on the task in `task_dir`."""
    check_task_name(name)
    return [
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        model_args(model_dir),
        "--include_path",
        str(task_dir),
        "--tasks",
        name,
        "--batch_size",
        "1",
        "--device",
        "cpu",
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m inftyformer.integrations.harness",
        description="Write an lm-evaluation-harness task over local text files "
        "(loglikelihood_rolling: word/byte perplexity, bits per byte).",
    )
    parser.add_argument("task_dir", help="folder to write NAME.yaml into (lm_eval --include_path)")
    parser.add_argument(
        "--data-dir", help="the text (default: the shared data directory, else the embedded novels)"
    )
    parser.add_argument("--split", default="test", choices=SPLITS)
    parser.add_argument("--max-docs", type=int, help="only the first N documents")
    parser.add_argument("--max-chars", type=int, help="only the first N characters of each")
    parser.add_argument("--name", default=TASK, help=f"the task's name (default {TASK})")
    parser.add_argument("--model", help="a saved memory model: print the lm_eval command for it")
    args = parser.parse_args(argv)
    try:
        path = write_task(
            args.task_dir, args.data_dir, args.split, args.max_docs, args.max_chars, args.name
        )
        line = (
            None
            if args.model is None
            else shlex.join(command(args.model, args.task_dir, args.name))
        )
    except (OSError, ValueError) as err:
        parser.exit(1, f"error: {err}\n")
    print(f"wrote {path}")
    if line:
        print(line)


if __name__ == "__main__":
    main()
