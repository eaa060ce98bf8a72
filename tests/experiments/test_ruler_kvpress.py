"""The kvpress rows of docs/results/ruler.md (experiments/ruler_kvpress.py, run in a venv of their
own) see the prompts lm_eval gives the other rows: `ruler.py --dump-prompts` writes the request text
the harness hands the model, its tokens, and a context/question split that rejoins into them; the
answers are scored by RULER's rule as lm_eval's own metric scores them; the compression ratio
keeps exactly 2,048 entries under kvpress's rounding. kvpress itself is not needed here.

Needs the extra `inftyformer[eval]` (lm-eval 0.4.x); CI installs it."""

import json

import pytest

pytest.importorskip("lm_eval")

import ruler as rr  # noqa: E402
import ruler_kvpress as rk  # noqa: E402

HAYSTACK = "The grass is green. The sky is blue. " * 6
DOCS = [  # shaped as lm_eval's niah documents: input, outputs, gen_prefix, lengths
    {
        "index": i,
        "input": "A special magic number is hidden within the following text.\n"
        f"{HAYSTACK}One of the special magic numbers for {key} is: {value}.\n{HAYSTACK}\n"
        f"What is the special magic number for {key} mentioned in the provided text?",
        "outputs": [value],
        "gen_prefix": f"The special magic number for {key} mentioned in the provided text is",
        "length": 120,
        "max_length": 4096,
    }
    for i, (key, value) in enumerate((("grass", "1234567"), ("sky", "7654321")))
]


def ruler_like_task():
    """An lm_eval task configured as lm_eval's niah_single_1.yaml (text, gen_prefix, delimiter,
    greedy settings, RULER's scoring) over two hand-made documents: made in no time."""
    import datasets
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.tasks.ruler import common_utils

    def documents(**_):
        return {"test": datasets.Dataset.from_list(DOCS)}

    return ConfigurableTask(
        config={
            "task": "niah_like", "custom_dataset": documents, "test_split": "test",
            "output_type": "generate_until", "doc_to_text": "{{input}}",
            "doc_to_target": "{{outputs}}", "gen_prefix": "{{gen_prefix}}",
            "target_delimiter": " ", "process_results": common_utils.process_results,
            "metric_list": [{"metric": "4096", "aggregation": common_utils.aggregate_metrics,
                             "higher_is_better": True}],
            "generation_kwargs": {"do_sample": False, "temperature": 0.0, "max_gen_toks": 128,
                                  "until": []},
        }
    )  # fmt: skip


def recording_model(seen: list):
    """An lm_eval model that keeps each request it is given and answers with a needle's value."""
    from lm_eval.api.model import LM

    class Recorder(LM):
        def generate_until(self, requests, disable_tqdm=False):
            seen.extend(r.args for r in requests)
            return [" 1234567." for _ in requests]

        def loglikelihood(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Recorder()


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tiny_pretrained import write_tiny_model
    from transformers import AutoTokenizer

    folder = write_tiny_model(tmp_path_factory.mktemp("tiny"), corpus=(DOCS[0]["input"],) * 5)
    return AutoTokenizer.from_pretrained(str(folder))


def test_the_dumped_prompts_are_the_requests_lm_eval_gives_the_model(tokenizer):
    import lm_eval

    records = rr.prompt_records(ruler_like_task(), 4096, 2, tokenizer)
    seen: list = []
    result = lm_eval.simple_evaluate(
        model=recording_model(seen), tasks=[ruler_like_task()], limit=2, log_samples=True,
        bootstrap_iters=0,
    )  # fmt: skip
    assert [r["prompt"] for r in records] == [args[0] for args in seen]
    assert [r["generation"] for r in records] == [args[1] for args in seen]
    samples = result["samples"]["niah_like"]
    assert [r["prompt_hash"] for r in records] == [s["prompt_hash"] for s in samples]
    assert [r["expected"] for r in records] == [["1234567"], ["7654321"]]
    # lm_eval joins the text and gen_prefix with the delimiter: the question line holds both
    assert records[1]["prompt"].endswith("provided text? The special magic number for sky "
                                         "mentioned in the provided text is")  # fmt: skip


def test_the_context_and_the_question_rejoin_into_the_prompt_and_its_tokens(tokenizer):
    for record in rr.prompt_records(ruler_like_task(), 4096, 2, tokenizer):
        prompt, start = record["prompt"], record["question_start"]
        ids, n = record["input_ids"], record["context_tokens"]
        assert ids == tokenizer(prompt, add_special_tokens=False)["input_ids"]  # as lm_eval's hf
        assert prompt[start - 1] == "\n" and "\n" not in prompt[start:]  # the last line
        assert 0 < n < len(ids)
        assert tokenizer.decode(ids[:n]) == prompt[:start]
        assert tokenizer.decode(ids[n:]) == prompt[start:]
        assert prompt[start:].startswith("What is the special magic number for")


def test_a_prompt_without_a_question_line_is_refused():
    with pytest.raises(ValueError, match="no newline"):
        rr.question_start("one line, no question of its own")


def test_the_score_is_rulers_as_lm_eval_computes_it():
    from lm_eval.tasks.ruler.common_utils import process_results

    cases = [
        (" 1234567.", ["1234567"]),
        ("the number is 12345", ["1234567"]),  # a part of it: not found
        ("ABC-def and xyz", ["abc-DEF", "XYZ", "qqq"]),  # case ignored; 2 of 3
        ("12\t34 56", ["12\n34"]),  # a control character is a newline to RULER
        ("", ["1"]),
        ("  \n 7 \x01", ["7 \n"]),
    ]
    for written, expected in cases:
        theirs = process_results({"max_length": 4096, "outputs": expected}, [written])["4096"]
        assert rk.ruler_score(written, expected) == pytest.approx(theirs), (written, expected)
    assert rk.ruler_score("ABC-def and xyz", ["abc-DEF", "XYZ", "qqq"]) == pytest.approx(2 / 3)


def test_the_compression_ratio_keeps_exactly_the_budget_under_kvpress_rounding():
    for context in [*range(2049, 2200), 3801, 4095, 8000, 16_384, 65_535, 131_072]:
        ratio = rk.compression_ratio(context)
        assert 0 < ratio < 1
        assert int(context * (1 - ratio)) == 2048  # kvpress keeps int(k_len * (1 - ratio))
    assert rk.compression_ratio(2048) == 0.0 and rk.compression_ratio(100) == 0.0


def test_a_file_that_is_not_a_dump_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"task": "niah_single_1", "length": 4096}) + "\n")
    with pytest.raises(ValueError, match="not a dumped prompt"):
        rk.read_prompts(path)


def test_the_page_shows_the_kvpress_rows_beside_the_others_and_how_they_were_run():
    def cell(row, score, n, **more):
        return {"row": row, "task": "niah_single_1", "length": 4096, "score": score,
                "samples": n, "interval": rr.wilson(score * n, n), **more}  # fmt: skip

    cells = {
        "full-niah_single_1-4096": cell("full", 1.0, 5),
        "kvpress_knorm-niah_single_1-4096": cell("kvpress_knorm", 0.6, 25, kvpress="0.5.5"),
    }
    data = {
        "setup": {"base_model": "m", "limit": 5, "seed": 0, "lengths": "4096", "lm_eval": "0.4.13"},
        "cells": cells, "machine": {"cpu": "c"},
    }  # fmt: skip
    page = rr.render(data)
    assert "| kvpress_knorm | 0.60 [0.41, 0.77] (25) |" in page
    assert "| kvpress_snapkv |" not in page  # a press never run: no row of dashes
    assert "compression_ratio = 1 − 2,048 / context tokens" in page
    assert "ruler_kvpress.py --prompts runs/ruler-prompts.jsonl" in page
    assert "--tasks niah_single_1 \\\n    --lengths 4096 --limit 25" in page
    assert "bash scripts/kvpress_env.sh" in page
    del cells["kvpress_knorm-niah_single_1-4096"]
    assert "kvpress" not in rr.render(data)


def test_a_cell_killed_between_prompts_resumes_at_the_next_one(tmp_path, monkeypatch):
    records = [
        {"task": "niah_single_1", "length": 4096, "input_ids": [1] * 30, "context_tokens": 20,
         "expected": [f"{i}{i}{i}"], "prompt_hash": f"h{i}", "ruler_length": 4096,
         "generation": {"max_gen_toks": 8, "until": []}}
        for i in range(4)
    ]  # fmt: skip
    asked: list[str] = []

    def fake_answer(model, tokenizer, press, record, n, cut=None):
        if len(asked) == 2 and not resumed:
            raise KeyboardInterrupt  # the run is stopped while it answers the third prompt
        asked.append(record["prompt_hash"])
        return f" {record['expected'][0]}.", 20

    monkeypatch.setattr(rk, "answer", fake_answer)
    monkeypatch.setattr(rk, "make_press", lambda row, ratio: None)
    monkeypatch.setattr(rk, "release_memory", lambda: None)
    monkeypatch.setattr(rk.metadata, "version", lambda name: "0.0")
    partial = tmp_path / "kvpress_knorm-niah_single_1-4096.partial.jsonl"
    resumed = False
    with pytest.raises(KeyboardInterrupt):
        rk.run_cell("kvpress_knorm", records, None, None, 8192, 32, 2048, partial)
    assert len(partial.read_text().splitlines()) == 2
    with open(partial, "a") as f:
        f.write('{"prompt_hash": "h2", "cut by the ki')  # a line half-written at the kill
    resumed = True
    cell = rk.run_cell("kvpress_knorm", records, None, None, 8192, 32, 2048, partial)
    assert asked == ["h0", "h1", "h2", "h3"]  # each prompt answered once
    assert [a["prompt_hash"] for a in cell["answers"]] == ["h0", "h1", "h2", "h3"]
    assert cell["samples"] == 4 and cell["score"] == 1.0
    # other settings than the stopped run's: its answers are not reused
    asked.clear()
    cell = rk.run_cell("kvpress_knorm", records, None, None, 8192, 64, 2048, partial)
    assert asked == ["h0", "h1", "h2", "h3"]
