"""experiments/retrieval_rank.py: the asked needle's rank among the stored blocks by hand, the
needles' slots on a tiny model's real state, and a quick run that ranks every stored question
under every score and resumes."""

import json
import sys
from pathlib import Path

import pytest
import retrieval_rank as rk
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
from tiny_hf import forty_token_retrieval  # noqa: E402

from inftyformer.retrieval.config import SCORES  # noqa: E402


def test_rank_is_the_best_slot_of_the_asked_number_against_the_other_needles():
    score = torch.tensor([0.1, 0.9, 0.5, 0.7, 0.3])  # order: slots 1, 3, 2, 4, 0
    slots = [[2, 4], [1], None, [0]]  # needle 0 in slots 2 and 4 (ranks 2, 3), needle 2 unread
    assert rk.ranks(score, slots, 0) == {"rank": 2, "above_distractors": False}  # below slot 1
    assert rk.ranks(score, slots, 1) == {"rank": 0, "above_distractors": True}
    assert rk.ranks(score, slots, 3) == {"rank": 4, "above_distractors": False}
    assert rk.ranks(score, [[3], None], 0) == {"rank": 1, "above_distractors": True}  # none


@torch.no_grad()
def test_needle_slots_are_the_stored_blocks_holding_each_number():
    # tokens 0-3 the sink, 4-23 five stored blocks of 4, 24-39 the window
    _, ids, state = forty_token_retrieval()
    passage = ids[0].tolist()
    answers = [passage[9:11], passage[14:18], passage[30:32], passage[1:3]]
    got = rk.needle_slots(passage, answers, state, 0, 4)
    assert got == [[1], [2, 3], None, None]  # stored; across two blocks; window; sink
    state.store.close()


@pytest.mark.slow
def test_a_quick_run_ranks_every_stored_question_under_every_score_and_resumes(tmp_path):
    rk.main(["--quick", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "retrieval_rank.json").read_text())
    (cell,) = data["cells"].values()
    assert cell["preset"] == "retrieval-near" and len(cell["samples"]) == 2  # 1 passage × 2
    for sample in cell["samples"]:
        if sample["stored"]:
            assert set(sample["scores"]) == set(SCORES)
            assert all(r["rank"] >= 0 for r in sample["scores"].values())
    page = (tmp_path / "retrieval_rank.md").read_text()
    assert all(f"| {s} |" in page for s in SCORES)
    path = next((tmp_path / "retrieval_rank.cells").glob("*.json"))
    stamp = path.stat().st_mtime_ns
    rk.main(["--quick", "--out", str(tmp_path)])  # the cell is there: skipped
    assert path.stat().st_mtime_ns == stamp


def test_a_quick_run_into_docs_is_refused(capsys):
    with pytest.raises(SystemExit):
        rk.main(["--quick"])
    assert "--quick needs an --out of its own" in capsys.readouterr().err
