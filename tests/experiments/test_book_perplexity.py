"""experiments/book_perplexity.py: the NLL block sums and bucket sums by hand, the pooled
perplexity, the paired ratio and their bootstrap intervals by hand; the quick run (a tiny random
Llama on the embedded corpus's held-out books) gives the window row the full row's NLL while
the window holds the whole past and not after, reports every bucket the books reach from the
cells it wrote, renders the page from the JSON and resumes without measuring again."""

import json
import math

import book_perplexity as bp
import pytest
import torch


def cell(sums: list[float], counts: list[int]) -> dict:
    return {"block": 64, "nll_sum": sums, "count": counts}


def test_block_sums_by_hand():
    nll = torch.arange(1, 130, dtype=torch.float32)  # NLL of positions 1 … 129 = the position
    sums, counts = bp.block_sums(nll)
    assert counts == [63, 64, 2]  # position 0 predicts nothing
    assert sums == [sum(range(1, 64)), sum(range(64, 128)), 128 + 129]


def test_a_bucket_the_cell_does_not_reach_is_not_reported():
    c = cell([1.0, 2.0, 3.0, 4.0], [63, 64, 64, 64])  # positions up to 256
    assert bp.bucket_nll(c, 64, 192) == (5.0, 128)
    assert bp.bucket_nll(c, 128, 256) == (7.0, 128)
    assert bp.bucket_nll(c, 128, 320) is None  # measured in part
    assert bp.bucket_nll(c, 100, 192) is None  # not on a block's edge


def test_pooled_perplexity_ratio_and_intervals_by_hand():
    blocks = 1024 * 4 // 64  # positions up to 4K: buckets [1K, 2K), [2K, 4K) and ≥ 1K
    counts = [63] + [64] * (blocks - 1)

    def row(nll_a: float, nll_b: float) -> dict:  # two books, a flat NLL each
        return {"a": cell([nll_a * n for n in counts], counts),
                "b": cell([nll_b * n for n in counts], counts)}  # fmt: skip

    rows = {"window": row(2.0, 3.0), "retrieval": row(1.9, 3.0)}
    cells = {f"{r}-{b}": c for r, books in rows.items() for b, c in books.items()}
    out = bp.summarise(cells, ["window", "retrieval"], ["a", "b"], 4096, 400, seed=0)
    at = out["rows"]["window"]["≥1K"]
    assert at["tokens"] == 2 * 3072 and at["ppl"] == pytest.approx(math.exp(2.5))
    assert at["per_book"] == pytest.approx([math.exp(2.0), math.exp(3.0)])
    lo, hi = at["interval"]  # some draws take one book twice: the interval spans both books
    assert lo == pytest.approx(math.exp(2.0)) and hi == pytest.approx(math.exp(3.0))
    assert "[4K, 8K)" not in out["rows"]["window"]  # the books end at 4K
    r = out["ratios"]["retrieval/window"]["[1K, 2K)"]
    assert r["ratio"] == pytest.approx(math.exp((1.9 + 3.0) / 2 - 2.5))
    assert r["per_book"] == pytest.approx([math.exp(-0.1), 1.0]) and r["books_below_1"] == 1
    assert r["interval"] == pytest.approx([math.exp(-0.1), 1.0])  # both books, or one twice
    assert list(out["ratios"]) == ["retrieval/window"]  # no streaming row: no other pair


def test_the_quick_run_window_is_the_full_context_while_it_holds_the_past(tmp_path):
    bp.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "book_perplexity.json").read_text())
    books = [b["id"] for b in data["setup"]["books"]]
    assert len(books) == 2 and data["setup"]["tokens"] == 4096
    cells_dir = tmp_path / "book_perplexity.cells"
    assert sorted(p.stem for p in cells_dir.glob("*.json")) == sorted(
        f"{r}-{b}" for r in bp.ROWS if r not in bp.HYBRID for b in books
    )
    for book in books:
        full = torch.tensor(data["cells"][f"full-{book}"]["nll_sum"])
        window = torch.tensor(data["cells"][f"window-{book}"]["nll_sum"])
        assert full.shape == window.shape == (4096 // 64,)
        # positions < 2,048: the window holds every earlier token, the logits are the base's
        torch.testing.assert_close(window[:32], full[:32], rtol=0, atol=1e-3)
        assert (window[40:] - full[40:]).abs().max() > 1e-3  # later it reads only the last 2K
    # the report's perplexities are the cells', per bucket the books reach
    for row in data["setup"]["rows"]:
        got = data["results"]["rows"][row]
        assert sorted(got) == sorted(["[1K, 2K)", "[2K, 4K)", "≥2K", "≥1K"])
        sums = [data["cells"][f"{row}-{b}"]["nll_sum"] for b in books]
        want = math.exp(sum(sum(s[32:64]) for s in sums) / (2 * 2048))
        assert got["[2K, 4K)"]["ppl"] == pytest.approx(want, rel=1e-12)
        lo, hi = got["≥1K"]["interval"]
        assert lo <= got["≥1K"]["ppl"] <= hi
    pairs = {"full/window", "streaming/window", "retrieval/window", "retrieval-near/window",
             "retrieval-picked/window", "retrieval/streaming", "retrieval-near/retrieval",
             "retrieval-picked/retrieval"}  # fmt: skip
    assert set(data["results"]["ratios"]) == pairs
    page = (tmp_path / "book_perplexity.md").read_text()
    assert "| row | [1K, 2K) | [2K, 4K) | [4K, 8K) | [8K, 16K) | ≥2K | ≥1K |" in page
    assert "Goal (retrieval no worse than the 2K window at positions ≥ 1K)" in page
    assert (tmp_path / "book_perplexity.png").stat().st_size > 0
    # a second run finds every cell with its settings: nothing measured again
    path = cells_dir / f"retrieval-{books[0]}.json"
    stamp = path.stat().st_mtime_ns
    bp.main(["--quick", "--out", str(tmp_path)])
    assert path.stat().st_mtime_ns == stamp


def test_bad_arguments_are_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bp.main(["--quick"])  # the tiny model's cells would land among docs/'s
    assert "--quick needs an --out of its own" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bp.main(["--rows", "retrieval", "--out", str(tmp_path), "--render-only"])
    assert "must include window" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bp.main(["--tokens", "1000", "--out", str(tmp_path), "--render-only"])
    assert "multiple of 64" in capsys.readouterr().err


def test_the_hybrid_rows_read_a_memory_once_text_left_the_window_and_the_other_books(tmp_path):
    """The hybrid row is the retrieval's until something left the window (its memory is empty
    and reads 0), then differs; hybrid-other reads another book's memory, so it differs from
    hybrid there too; the ratios compare them."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from inftyformer.retrieval.continuous import ContinuousConfig
    from inftyformer.retrieval.model import RetrievalLM

    folder = bp.quick_model(tmp_path / "quick-model")
    base = AutoModelForCausalLM.from_pretrained(str(folder))
    model = RetrievalLM(base, preset="retrieval", memory=ContinuousConfig())
    torch.manual_seed(0)
    weights = {k: v + 0.05 * torch.randn_like(v) for k, v in model.memory.state_dict().items()}
    path = tmp_path / "memory.safetensors"
    save_file(weights, str(path), metadata={"settings": json.dumps({"layers": []})})
    rows = "window,retrieval,hybrid,hybrid-other"
    bp.main(["--quick", "--out", str(tmp_path), "--rows", rows, "--memory-weights", str(path)])
    data = json.loads((tmp_path / "book_perplexity.json").read_text())
    empty = (960 + 64) // 64  # blocks of positions before anything left the 960-token window
    for book in (b["id"] for b in data["setup"]["books"]):
        got = {r: torch.tensor(data["cells"][f"{r}-{book}"]["nll_sum"]) for r in rows.split(",")}
        torch.testing.assert_close(got["hybrid"][:empty], got["retrieval"][:empty])
        torch.testing.assert_close(got["hybrid-other"][:empty], got["retrieval"][:empty])
        assert (got["hybrid"][empty:] - got["retrieval"][empty:]).abs().max() > 1e-3
        assert (got["hybrid"][empty:] - got["hybrid-other"][empty:]).abs().max() > 1e-3
    assert {"hybrid/retrieval", "hybrid-other/retrieval", "hybrid/hybrid-other"} <= set(
        data["results"]["ratios"]
    )
    page = (tmp_path / "book_perplexity.md").read_text()
    r = data["results"]["ratios"]["hybrid/retrieval"]["≥2K"]
    assert f"hybrid/retrieval at ≥2K = {r['ratio']:.4f}" in page  # the verdict, from the JSON
    assert "Goal (a memory, not an adapter" in page
    with pytest.raises(SystemExit):
        bp.main(["--quick", "--out", str(tmp_path), "--rows", rows])


def test_hybrid_empty_reads_the_adapters_alone_and_leaves_the_base_as_it_was(tmp_path):
    """Weights trained with low-rank adapters: hybrid-empty (the same weights, the memory empty)
    differs from the retrieval from the first token (the adapters), hybrid equals it while the
    memory is empty; the adapters are taken off the shared base after each cell (a retrieval
    cell measured after them is the one measured alone)."""
    from _lora import LoRA, LoRAConfig
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from inftyformer.retrieval.continuous import ContinuousConfig
    from inftyformer.retrieval.model import RetrievalLM

    folder = bp.quick_model(tmp_path / "quick-model")
    base = AutoModelForCausalLM.from_pretrained(str(folder))
    model = RetrievalLM(base, preset="retrieval", memory=ContinuousConfig())
    torch.manual_seed(0)
    memory = {k: v + 0.05 * torch.randn_like(v) for k, v in model.memory.state_dict().items()}
    settings = {
        "layers": [],
        "lora_rank": 2,
        "lora_alpha": 4.0,
        "lora_targets": ["q_proj", "v_proj"],
    }
    lora = LoRA(base, LoRAConfig(2, 4.0))
    adapters = {k: 0.05 * torch.randn_like(v) for k, v in lora.state_dict().items()}
    weights = tmp_path / "run" / "memory.safetensors"
    weights.parent.mkdir()
    for name, tensors in (("memory", memory), ("lora", adapters)):
        save_file(tensors, str(weights.with_name(f"{name}.safetensors")),
                  metadata={"settings": json.dumps(settings)})  # fmt: skip
    rows = "window,hybrid,hybrid-empty,retrieval"  # retrieval after the adapters' rows
    out = tmp_path / "out"
    bp.main(["--quick", "--out", str(out), "--rows", rows, "--memory-weights", str(weights)])
    bp.main(["--quick", "--out", str(tmp_path / "alone"), "--rows", "window,retrieval"])
    data = json.loads((out / "book_perplexity.json").read_text())
    alone = json.loads((tmp_path / "alone" / "book_perplexity.json").read_text())
    empty = (960 + 64) // 64  # blocks of positions before anything left the 960-token window
    for book in (b["id"] for b in data["setup"]["books"]):
        got = {r: torch.tensor(data["cells"][f"{r}-{book}"]["nll_sum"]) for r in rows.split(",")}
        assert (got["hybrid-empty"][:empty] - got["retrieval"][:empty]).abs().min() > 1e-3
        torch.testing.assert_close(got["hybrid"][:empty], got["hybrid-empty"][:empty])
        assert (got["hybrid"][empty:] - got["hybrid-empty"][empty:]).abs().max() > 1e-3
        cell = data["cells"][f"hybrid-empty-{book}"]["settings"]
        assert set(cell) >= {"memory_weights", "lora_weights"}  # both weights by digest
        # (to round-off: the other run loads its own copy of the model)
        by_itself = torch.tensor(alone["cells"][f"retrieval-{book}"]["nll_sum"])
        torch.testing.assert_close(got["retrieval"], by_itself, rtol=1e-6, atol=0)
    assert {"hybrid/hybrid-empty", "hybrid-empty/retrieval"} <= set(data["results"]["ratios"])


def test_the_verdict_asks_the_memory_to_beat_its_own_weights_with_the_memory_empty():
    """With a hybrid-empty row the goal needs hybrid at least 1% below it too (the whole
    interval): a gain the adapters alone give is not the memory's."""
    from _book_perplexity_report import hybrid_verdict

    def ratio(value, lo, hi):
        return {"ratio": value, "interval": [lo, hi], "per_book": [value] * 4, "books_below_1": 4}

    ratios = {"hybrid/retrieval": {"≥2K": ratio(0.95, 0.94, 0.96),
                                   "[1K, 2K)": ratio(0.99, 0.985, 0.995),
                                   "[8K, 16K)": ratio(0.93, 0.92, 0.94)},
              "hybrid/hybrid-other": {"≥2K": ratio(0.97, 0.96, 0.98)}}  # fmt: skip
    met = hybrid_verdict({"results": {"ratios": ratios}})
    assert "): met.**" in met and "than none" not in met
    ratios["hybrid/hybrid-empty"] = {"≥2K": ratio(0.995, 0.99, 1.0)}
    verdict = hybrid_verdict({"results": {"ratios": ratios}})
    assert "and than none): not met.**" in verdict
    assert "memory empty (the whole interval below 0.99): no: hybrid/hybrid-empty" in verdict
    ratios["hybrid/hybrid-empty"] = {"≥2K": ratio(0.97, 0.96, 0.98)}
    assert "and than none): met.**" in hybrid_verdict({"results": {"ratios": ratios}})
