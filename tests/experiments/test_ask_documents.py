"""experiments/ask_documents.py: the exact McNemar test and the Wilson interval by hand, the
summary pairs a preset's answers with `full`'s, the documents hold their facts, and the quick run
(a tiny random chat model) answers every document in both rows, measures the cost, renders its
tables between the page's markers and, run again, makes no answer it already has."""

import json

import ask_documents as ad
import pytest

pytest.importorskip("transformers")


def test_mcnemar_by_hand():
    assert ad.mcnemar(0, 0) == 1.0  # no discordant pair: no evidence either way
    assert ad.mcnemar(5, 1) == pytest.approx(2 * (1 + 6) / 2**6)  # 2 · P(X ≤ 1), X ~ Bin(6, ½)
    assert ad.mcnemar(3, 0) == pytest.approx(2 / 2**3)
    assert ad.mcnemar(4, 4) == 1.0  # 2 · P(X ≤ 4) > 1: capped


def record(row: str, kind: str, condition: str, doc: int, right: bool | None) -> dict:
    done = {"right": right} if right is not None else {"skipped": "beyond its positions"}
    return dict(part="answer", row=row, kind=kind, condition=condition, doc=doc, length=64) | done


def test_the_summary_pairs_each_preset_with_full():
    mine, full = [True, True, True, False], [False, False, True, False]
    records = [record("retrieval", "code", "one", i, r) for i, r in enumerate(mine)]
    records += [record("full", "code", "one", i, r) for i, r in enumerate(full)]
    records += [
        record("retrieval", "prose", "alike", 0, True),
        record("full", "prose", "alike", 0, None),
    ]
    out = ad.summarise(records, ["retrieval", "full"])
    cell = out["cells"]["retrieval/code/one"]
    assert (cell["right"], cell["n"]) == (3, 4)
    # Wilson, z = 1.96: (0.75 + z²/8 ± z·√(0.75·0.25/4 + z²/64)) / (1 + z²/4)
    assert cell["interval"] == pytest.approx([0.30064, 0.95441], abs=1e-5)
    assert (
        out["cells"]["full/code/one"]["right"] == 1 and out["cells"]["full/prose/alike"]["n"] == 0
    )
    assert (out["cells"]["retrieval/all/all"]["right"], out["cells"]["retrieval/all/all"]["n"]) == (
        4,
        5,
    )
    # documents 0 and 1 right by retrieval alone, none by full alone: 2 · ½² = 0.5; the prose
    # answer has no pair (full skipped it), so the test over all answers is the same
    assert out["mcnemar"]["retrieval/code/one"] == {"b": 2, "c": 0, "p": 0.5}
    assert out["mcnemar"]["retrieval/all/all"] == {"b": 2, "c": 0, "p": 0.5}
    assert "full/all/all" not in out["mcnemar"]


def test_the_quick_run_answers_every_document_once(tmp_path, shared_data, monkeypatch):
    from transformers import AutoTokenizer

    args = ["--quick", "--out", str(tmp_path), "--data-dir", str(shared_data)]
    ad.main(args)
    data = json.loads((tmp_path / "ask_documents.json").read_text())
    assert data["setup"]["rows"] == ["retrieval", "full"] and data["setup"]["documents"] == 2
    answers = data["answers"]
    assert len(answers) == 2 * 3 * 2 * 2 and all("answer" in a for a in answers)  # all fit
    for row, (kind, condition) in [(r, g) for r in ("retrieval", "full") for g in ad.GROUPS[:-1]]:
        assert data["cells"][f"{row}/{kind}/{condition}"]["n"] == 2
    asked = {(a["kind"], a["doc"]): (a["code"], a["depth"]) for a in answers}
    assert len(asked) == 3 * 2  # both rows, both conditions: the same fact asked of a document
    (cost,) = data["cost"]
    assert cost["row"] == "retrieval" and cost["tokens"] >= 1024 and cost["same_answer"]
    assert cost["peak_rss_mib"] >= cost["loaded_rss_mib"] > 0
    page = (tmp_path / "ask_documents.md").read_text()
    assert "| retrieval vs full: McNemar p | 1 | 1 |" in page and "| retrieval | 1,0" in page

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "quick-model"))
    for kind in ad.KINDS:
        one = ad.document(tokenizer, kind, 1, "one", 320, 0, shared_data)
        alike = ad.document(tokenizer, kind, 1, "alike", 320, 0, shared_data)
        assert one[1:] == alike[1:] and one[2:] == asked[kind, 1]  # question, code, depth
        assert str(one[2]) in one[0] and str(one[2]) in alike[0]
        assert one[0].count("access code") == 1 and alike[0].count("access code") == 4
        assert abs(len(tokenizer(alike[0])["input_ids"]) - 320) <= 8

    lines = (tmp_path / "ask_documents.jsonl").read_text().splitlines()
    monkeypatch.setattr(ad, "answer", lambda *a: pytest.fail("answered again"))
    monkeypatch.setattr(ad._measure, "run_worker", lambda *a, **k: pytest.fail("measured again"))
    ad.main(args)
    assert (tmp_path / "ask_documents.jsonl").read_text().splitlines() == lines

    other = tmp_path / "page.md"
    other.write_text(f"intro\n{ad.BEGIN}\nold\n{ad.END}\nrest\n")
    ad.write_page(data, other)
    text = other.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "old" not in text
