"""experiments/retrieval_where.py: where a span of the stream is read from after a prefill
(sink, window, a chosen stored block, some of them, none), on a tiny model's real state."""

import sys
from pathlib import Path

import pytest
import retrieval_where as rw
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
from tiny_hf import forty_token_retrieval  # noqa: E402


@torch.no_grad()
def test_a_span_is_placed_where_the_state_reads_it():
    # tokens 0-3 the sink, 4-23 five stored blocks of 4, 24-39 the window
    model, ids, state = forty_token_retrieval()
    assert (int(state.sink_len[0]), int(state.blocks[0]), int(state.window_len[0])) == (4, 5, 16)
    stored = state.block_ids[0].tolist()  # stream order: tokens 4-7, 8-11, …, 20-23
    chosen = [stored[1], stored[2]]  # tokens 8-15
    assert rw.place_of(range(1, 3), state, 0, chosen, model) == "sink"
    assert rw.place_of(range(30, 35), state, 0, chosen, model) == "window"
    assert rw.place_of(range(9, 14), state, 0, chosen, model) == "chosen"
    assert rw.place_of(range(13, 18), state, 0, chosen, model) == "partly"
    assert rw.place_of(range(17, 23), state, 0, chosen, model) == "missed"
    state.store.close()


@pytest.mark.parametrize(
    "passage, answer, found",
    [([5, 1, 2, 3, 1, 2], [1, 2], range(1, 3)), ([1, 2, 3], [2, 4], None), ([7], [7], range(0, 1))],
)
def test_find_gives_the_first_occurrence_of_the_number(passage, answer, found):
    assert rw.find(passage, answer) == found


def test_the_page_gives_each_task_its_row_counts_and_command():
    def cell(preset, where, exact, **more):
        return {"preset": preset, "length": 4096, "answers": [{"where": where, "exact": exact}],
                **more}  # fmt: skip

    data = {
        "setup": {"base_model": "b", "needles": 5, "passages": 5, "seed": 0},
        "machine": {"cpu": "c"},
        "cells": {
            "retrieval-4096": cell("retrieval", "chosen", False),  # written before tasks: multikey
            "single-retrieval-4096": cell(
                "retrieval", "missed", True, task="single", passages=25, needles=1
            ),
        },
    }
    page = rw.render(data)
    assert "| multikey | 5 × 5 | retrieval | 4,096 | – | – | 0/1" in page
    assert "| single | 25 × 1 | retrieval | 4,096 | – | – | – | – | 1/1" in page
    assert "--tasks single --lengths 4096 --presets retrieval --passages 25" in page
    assert "--tasks multikey --lengths 4096 --presets retrieval --passages 5" in page
