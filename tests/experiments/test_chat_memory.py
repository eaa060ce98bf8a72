"""experiments/chat_memory.py: a conversation holds the asked fact (and its alike facts) where
it says, said far enough back; the cells and paired counts are the answers' (by hand); the quick
run (a tiny random chat model) answers every chat in every row from one read of its talk and,
run again, answers nothing it has."""

import json

import chat_memory as cm
import pytest

pytest.importorskip("transformers")


def test_the_cells_and_their_paired_counts_are_the_answers():
    """retrieval right on chats 0, 1; packed on 1, 2, 3 of the same four: 2 : 1 against it."""
    right = {"retrieval": {0, 1}, "packed": {1, 2, 3}}
    answers = [{"row": r, "distance": 600, "alike": False, "chat": c, "right": int(c in right[r]),
                "gap": 610} for r in right for c in range(4)]  # fmt: skip
    cells = cm.summarise(answers, ["retrieval", "packed"])
    assert cells["retrieval-600-one"]["right"] == 2 and "paired" not in cells["retrieval-600-one"]
    q = cells["packed-600-one"]
    assert (q["right"], q["chats"]) == (3, 4) and q["interval"] == pytest.approx(cm.wilson(3, 4))
    assert q["paired"] == {"against": "retrieval", "b": 2, "c": 1, "p": 1.0}
    data = {"setup": {"base_model": "m", "rows": ["retrieval", "packed"]}, "cells": cells,
            "answers": answers, "command": "c", "machine": {"cpu": "x"}}  # fmt: skip
    page = cm.render(data)
    assert "one fact, ~600 tokens back (610–610)" in page
    assert "| packed | 3/4 [0.30, 0.95]; 2 : 1, p = 1.00 |" in page


def test_a_conversation_says_the_asked_fact_far_enough_back(shared_data):
    from transformers import AutoTokenizer

    from inftyformer.retrieval.prompts import TurnFormat

    tokenizer = AutoTokenizer.from_pretrained(str(shared_data / "gpt2-tokenizer"))  # plain turns
    fmt = TurnFormat.of(tokenizer)
    one = cm.conversation(tokenizer, fmt, 2, 300, False, 0, shared_data)
    alike = cm.conversation(tokenizer, fmt, 2, 300, True, 0, shared_data)
    ids, turn, code, gap = one
    text = tokenizer.decode(ids)
    assert text.count("By the way, the code of my") == 1 and str(code) in text
    assert tokenizer.decode(alike[0]).count("By the way, the code of my") == 4
    assert alike[2] == one[2] and alike[3] >= gap  # the same fact asked (facts said after it)
    assert 300 <= gap < len(ids) - cm.BEFORE // 2
    assert text.startswith(fmt.start) and not text.endswith(fmt.between)
    asked = tokenizer.decode(turn)
    assert asked.startswith(fmt.between) and asked.endswith(fmt.after_user)
    assert "What is the code of my " + text.split("the code of my ")[1].split(" is ")[0] in asked


def test_the_quick_run_answers_each_chat_once_from_one_read(tmp_path, shared_data, monkeypatch):
    args = ["--quick", "--out", str(tmp_path), "--data-dir", str(shared_data)]
    cm.main(args)
    data = json.loads((tmp_path / "chat_memory.json").read_text())
    assert [(a["row"], a["chat"]) for a in data["answers"]] == [
        (r, c) for c in range(2) for r in cm.ROWS
    ]
    assert len(list((tmp_path / "sessions").iterdir())) == 2  # one read of each chat's talk
    assert set(data["cells"]) == {f"{r}-120-one" for r in cm.ROWS}
    lines = (tmp_path / "answers.jsonl").read_text().splitlines()
    monkeypatch.setattr(cm, "answer_of", lambda *a: pytest.fail("answered again"))
    monkeypatch.setattr(cm, "saved_read", lambda *a: pytest.fail("read again"))
    cm.main(args)
    assert (tmp_path / "answers.jsonl").read_text().splitlines() == lines
    assert "| whole-window |" in (tmp_path / "chat_memory.md").read_text()
