"""experiments/train_hybrid_memory.py on a tiny random Llama and two made-up books: it trains and
writes the memory's weights (its read's output projection moves off zero) and its log, resumes
where it stopped, and refuses to resume with other settings."""

import csv
import sys
from pathlib import Path

import pytest
import torch
import train_hybrid_memory as th
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_pretrained import write_tiny_model  # noqa: E402


def model_and_books(tmp_path: Path) -> Path:
    """A tiny random Llama (its folder returned) and two made-up train books under
    tmp_path/data/pg19-mini/train."""
    text = "the memory of a long book, said the signal, and the window let it go. " * 400
    model_dir = write_tiny_model(tmp_path / "model", corpus=(text,), max_positions=4096)
    books = tmp_path / "data" / "pg19-mini" / "train"
    books.mkdir(parents=True)
    for i in range(2):
        (books / f"{i}.txt").write_text(text[i:])
    return model_dir


def test_it_trains_the_memory_only_and_resumes(tmp_path):
    model_dir = model_and_books(tmp_path)
    out = tmp_path / "run"
    argv = ["--base-model", str(model_dir), "--data-dir", str(tmp_path / "data"), "--out",
            str(out), "--minutes", "0.0001", "--doc-tokens", "1792"]  # fmt: skip
    th.main(argv)
    first = load_file(str(out / "memory.safetensors"))
    steps = list(csv.DictReader(open(out / "train.csv")))
    # 1,792 tokens: 1,280 read without gradient, then two calls of 256, one step each
    assert [int(r["step"]) for r in steps] == [1, 2]
    model = th.build(str(model_dir), {"layers": []})
    fresh = model.memory.state_dict()
    assert any(not torch.equal(first[k], fresh[k]) for k in fresh)  # the memory trained
    out_weight = [k for k in first if k.endswith("attention.out.weight")]
    assert out_weight and all(first[k].abs().max() > 0 for k in out_weight)  # from zero
    th.main(argv)  # resumes: its steps go on from 2
    assert [int(r["step"]) for r in csv.DictReader(open(out / "train.csv"))] == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="other settings"):
        th.main([*argv, "--lr", "0.5"])


def test_the_contrast_reads_the_other_books_memory_and_logs_its_loss(tmp_path, monkeypatch):
    """--contrast: each trained call is read twice, the second time with the rows' memories
    swapped (row 0 reads row 1's signal and waiting tokens); its loss is logged, and the run
    resumes only under the same settings."""
    model_dir = model_and_books(tmp_path)
    reads = []  # the continuous state each trained call read
    build = th.build

    def recording(*args):
        model = build(*args)
        forward = model.forward

        def forward_recorded(ids, state=None, *rest, targets=None, **kw):
            if targets is not None:
                reads.append(state.continuous)
            return forward(ids, state, *rest, targets=targets, **kw)

        model.forward = forward_recorded
        return model

    monkeypatch.setattr(th, "build", recording)
    out = tmp_path / "run"
    argv = ["--base-model", str(model_dir), "--data-dir", str(tmp_path / "data"), "--out",
            str(out), "--minutes", "0.0001", "--doc-tokens", "1792", "--contrast", "1"]  # fmt: skip
    th.main(argv)
    assert len(reads) == 4  # two steps, each read twice
    for own, other in (reads[0:2], reads[2:4]):
        assert torch.equal(other.waiting, own.waiting.flip(1))  # [m, b, M, e]: rows swapped
        B_own, B_other = own.long_term[0].coefficients, other.long_term[0].coefficients
        assert torch.equal(B_other, B_own.flip(0))  # [b, N, e]
        assert not torch.equal(other.waiting, own.waiting)
    rows = list(csv.DictReader(open(out / "train.csv")))
    assert [int(r["step"]) for r in rows] == [1, 2] and all(r["other_lm_loss"] for r in rows)
    th.main(argv)
    assert [int(r["step"]) for r in csv.DictReader(open(out / "train.csv"))] == [1, 2, 3, 4]
    with pytest.raises(SystemExit, match="other settings"):
        th.main([*argv[:-2], "--contrast", "2"])


def test_adapters_train_beside_the_memory_and_resume(tmp_path):
    """--lora-rank: the base's query and value projections get low-rank adapters, trained with
    the memory (B moves off zero) and saved beside it; a run resumes with them, and only under
    the same adapter settings."""
    model_dir = model_and_books(tmp_path)
    out = tmp_path / "run"
    argv = ["--base-model", str(model_dir), "--data-dir", str(tmp_path / "data"), "--out",
            str(out), "--minutes", "0.0001", "--doc-tokens", "1792",
            "--lora-rank", "2"]  # fmt: skip
    th.main(argv)
    adapters = load_file(str(out / "lora.safetensors"))
    b = [k for k in adapters if k.startswith("b.")]
    assert b and all(k.endswith(("q_proj", "v_proj")) for k in b)
    assert all(adapters[k].abs().max() > 0 for k in b)  # trained off zero
    th.main(argv)  # resumes with the adapters it saved
    resumed = load_file(str(out / "lora.safetensors"))
    assert [int(r["step"]) for r in csv.DictReader(open(out / "train.csv"))] == [1, 2, 3, 4]
    assert any(not torch.equal(resumed[k], adapters[k]) for k in b)
    with pytest.raises(SystemExit, match="other settings"):
        th.main([*argv[:-1], "4"])  # another rank


def test_set_changes_the_retrieval_beside_the_memory_and_its_rows_read_it_back(tmp_path):
    """--set: the memory trains beside the default changed by those settings (here the sink
    and a short window only: fewer calls read without gradient), the settings are kept in the
    weights, book_perplexity.py's hybrid rows build the same reader from them and record them
    in the cells' settings, and a bad setting is refused before the base loads."""
    from _hybrid import hybrid_model, reader_settings
    from book_perplexity import cell_settings
    from transformers import AutoModelForCausalLM

    model_dir = model_and_books(tmp_path)
    out = tmp_path / "run"
    argv = ["--base-model", str(model_dir), "--data-dir", str(tmp_path / "data"), "--out",
            str(out), "--minutes", "0.0001", "--doc-tokens", "1792",
            "--set", "choice=none", "--set", "window=448"]  # fmt: skip
    th.main(argv)
    # 1,792 tokens: 768 read without gradient (448 + two blocks of 64, in calls of 256), then
    # four calls of 256, one step each (the default's window of 960 leaves two)
    assert [int(r["step"]) for r in csv.DictReader(open(out / "train.csv"))] == [1, 2, 3, 4]
    weights = out / "memory.safetensors"
    assert reader_settings(weights) == {"choice": "none", "window": 448}
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    for memory in (True, False):
        with hybrid_model(base, weights, memory) as model:
            assert (model.config.window, model.config.blocks) == (448, 0)
            assert (model.memory is not None) == memory
    recorded = cell_settings("hybrid", 1024, str(model_dir), 4096, weights)["preset"]
    assert (recorded["window"], recorded["choice"]) == (448, "none")
    with pytest.raises(SystemExit, match="other settings"):
        th.main(argv[:-2])  # the same run without one of its settings
    with pytest.raises(TypeError, match="windw"):
        th.main([*argv[:-2], "--set", "windw=448", "--out", str(tmp_path / "bad")])
    assert not (tmp_path / "bad").exists()
