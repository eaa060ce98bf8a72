"""The user's own text, in whatever layout it comes: train on a flat folder, evaluate on a folder
holding one split, a flat folder, one file or standard input, and generate from a long file."""

import json
import random
import re

import pytest
from test_cli_lm import TINY
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.commands.generate import visible_text
from inftyformer.data.corpus import split_flat_folder

WORDS = "the of memory book long short continuous said and ∞ é".split()


def text(seed: int, words: int = 60) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words)) + "\n"


def run(*args, stdin: str | None = None):
    result = CliRunner().invoke(app, [str(a) for a in args], input=stdin)
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory):
    """A tiny language model trained on a flat folder of 40 .txt files (no subfolders)."""
    root = tmp_path_factory.mktemp("own")
    books = root / "books"
    books.mkdir()
    for i in range(40):
        (books / f"book{i:02d}.txt").write_text(text(i), encoding="utf-8")
    out = root / "run"
    code, output = run("train", "lm", "--data-dir", books, "-o", out, *TINY)
    assert code == 0, output
    return root, books, out


def test_training_on_a_flat_folder_holds_out_files_by_name(flat_run):
    root, books, out = flat_run
    splits = split_flat_folder(sorted(books.glob("*.txt")))
    assert sum(len(files) for files in splits.values()) == 40
    assert splits["valid"] and splits["test"] and not set(splits["valid"]) & set(splits["test"])
    results = json.loads((out / "results.json").read_text())
    test_bytes = sum(len(p.read_bytes()) for p in splits["test"])
    assert results["test"]["tokens"] == test_bytes  # bytes tokenizer: exactly the test files


@pytest.mark.parametrize("layout", ["split-only", "flat", "file", "stdin"])
def test_evaluate_on_each_layout(flat_run, layout, tmp_path):
    _, _, out = flat_run
    docs = [text(100 + i) for i in range(3)]
    stdin = None
    if layout == "split-only":  # only the requested split's folder exists
        (tmp_path / "test").mkdir()
        for i, doc in enumerate(docs):
            (tmp_path / "test" / f"{i}.txt").write_text(doc, encoding="utf-8")
        source, expected, label = tmp_path, docs, f"{tmp_path} (test): ppl "
    elif layout == "flat":  # every file is evaluated
        for i, doc in enumerate(docs):
            (tmp_path / f"{i}.txt").write_text(doc, encoding="utf-8")
        source, expected, label = tmp_path, docs, f"{tmp_path}: ppl "
    elif layout == "file":
        (tmp_path / "one.txt").write_text(docs[0], encoding="utf-8")
        source, expected, label = tmp_path / "one.txt", docs[:1], f"{tmp_path / 'one.txt'}: ppl "
    else:
        source, expected, stdin, label = "-", docs[:1], docs[0], "standard input: ppl "
    code, output = run("evaluate", out, "--data-dir", source, "--json", tmp_path / "e.json",
                       stdin=stdin)  # fmt: skip
    assert code == 0, output
    assert output.startswith(label) and "test ppl" not in output  # the text scored, not a split
    saved = json.loads((tmp_path / "e.json").read_text())
    assert saved["details"]["num_docs"] == len(expected)
    assert saved["metrics"]["tokens"] == sum(len(d.encode("utf-8")) for d in expected)


def test_unusable_text_is_a_clear_error(flat_run, tmp_path):
    _, _, out = flat_run
    empty = tmp_path / "empty"
    empty.mkdir()
    code, output = run("evaluate", out, "--data-dir", empty)
    assert code != 0 and "no .txt files in" in output
    (tmp_path / "nontxt").mkdir()
    (tmp_path / "nontxt" / "notes.md").write_text("# not a .txt\n")
    code, output = run("evaluate", out, "--data-dir", tmp_path / "nontxt")
    assert code != 0 and "no .txt files in" in output
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    code, output = run("evaluate", out, "--data-dir", tmp_path / "latin1.txt")
    assert code != 0 and "latin1.txt" in output and "UTF-8" in output
    code, output = run("evaluate", out, "--data-dir", tmp_path / "missing")
    assert code != 0 and "not found" in output
    code, output = run("evaluate", out, "--data-dir", "-", stdin="  \n")
    assert code != 0 and "standard input holds no text" in output


def test_generate_streams_a_long_prompt_file_into_memory(flat_run, tmp_path):
    _, _, out = flat_run
    long_doc = "".join(text(200 + i) for i in range(30))  # ~12K bytes: hundreds of segments
    (tmp_path / "long.txt").write_text(long_doc, encoding="utf-8")
    code, output = run("generate", out, "--prompt-file", tmp_path / "long.txt",
                       "--max-new-tokens", 5)  # fmt: skip
    assert code == 0, output
    tokens = len(long_doc.encode("utf-8")) + 1  # bytes + the beginning-of-document token
    assert f"prompt: {tokens:,} tokens" in output and "segments of 16" in output
    # every token, the prompt's and the 5 new ones, is in one memory or the other
    memory = re.search(
        r"memory: long-term memory ([\d,]+) tokens .*short-term memory (\d+) ", output
    )
    assert memory is not None, output
    stored, recent = (int(n.replace(",", "")) for n in memory.groups())
    assert stored + recent == tokens + 5 and 0 < recent <= 16 + 16  # mem_len + one segment
    assert "decoding: sampling at temperature 0.8, top-p 0.9 (seed 0" in output  # text's default
    # read with a bar before generating, the long prompt gives what generate itself gives
    from inftyformer.training import load_run

    code, output = run("generate", out, "--prompt-file", tmp_path / "long.txt",
                       "--max-new-tokens", 5, "--temperature", 0)  # fmt: skip
    saved = load_run(out)
    task = saved.task()
    ids = task.encode_prompt(long_doc)[0][None]
    expected = saved.model.generate(ids, max_new_tokens=5, temperature=0)[0][0].tolist()
    assert f"output:   {visible_text(task.decode(expected))}\n" in output, output
    code, output = run("generate", out, "--prompt", "Hi", "--max-new-tokens", 2, "--temperature", 0)
    assert code == 0 and "decoding: greedy" in output, output
    # a short prompt never reaches the long-term memory, and the report says so
    assert (
        "memory: long-term memory empty (text enters it once it has left the short-term " in output
    )
    assert "short-term memory 5 tokens" in output  # its start, "Hi" and the 2 new tokens
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    code, output = run("generate", out, "--prompt-file", tmp_path / "bad.txt")
    assert code != 0 and "not UTF-8" in output
