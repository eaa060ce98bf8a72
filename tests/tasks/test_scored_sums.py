"""`scored_sums` in chunks of positions gives the sums over the whole logits at once."""

import pytest
import torch

from inftyformer.native.model import IGNORE_INDEX
from inftyformer.tasks.base import scored_sums


def _whole(logits, targets):
    mask = targets != IGNORE_INDEX
    lg, tg = logits[mask].float(), targets[mask]
    nll = float(torch.nn.functional.cross_entropy(lg, tg, reduction="sum"))
    return {"nll": nll, "correct": float((lg.argmax(-1) == tg).sum()), "count": float(mask.sum())}


@pytest.mark.parametrize("chunk_elements", [1, 11 * 2, 11 * 5, 1 << 22])
def test_chunks_give_the_whole_sums(chunk_elements):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 7, 11, generator=g) * 3
    targets = torch.randint(0, 11, (3, 7), generator=g)
    targets[0, :] = IGNORE_INDEX  # a chunk of ignored positions only
    targets[2, 3] = IGNORE_INDEX
    logits[1, 2, targets[1, 2]] = 50.0  # at least one hit
    got, want = scored_sums(logits, targets, chunk_elements), _whole(logits, targets)
    assert got["count"] == want["count"] == 13 and got["correct"] == want["correct"] >= 1
    assert got["nll"] == pytest.approx(want["nll"], rel=1e-6)


def test_nothing_scored_gives_zeros():
    targets = torch.full((2, 4), IGNORE_INDEX)
    assert scored_sums(torch.randn(2, 4, 5), targets) == {"nll": 0.0, "correct": 0.0, "count": 0.0}
