"""The retrieval's behaviour on fixed inputs, for checking that a refactoring leaves it unchanged:
the logits of the default preset's choice, of other choices and of both baselines (scaled
down to a tiny random Llama of 4 blocks, at 64 and 512 positions), over a streamed document, a
question read with `reselect`, a greedy answer and one more token, saved to one file; two such
files are compared tensor by tensor (exactly).

    python scripts/retrieval_parity.py --out before.pt          # on the old commit
    python scripts/retrieval_parity.py --out after.pt           # on the new one
    python scripts/retrieval_parity.py --compare before.pt after.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "hf")]

SCALE = dict(block_size=4, segment_len=8)  # the presets' 64-token blocks, 256-token calls
ROWS = {  # choices' settings at that scale (the budget of read places kept in proportion)
    "question": dict(  # the default preset's choice
        choice="question",
        blocks=4,
        sink_blocks=1,
        window=12,
        read_from=0,
        select_queries=4,
        question_window=4,
    ),  # fmt: skip
    "packed": dict(choice="max", blocks=4, sink_blocks=1, window=12, read_from=0),
    "nearest": dict(
        choice="max", blocks=6, sink_blocks=1, window=8, read_from=0, layout="nearest"
    ),  # fmt: skip
    "picked": dict(
        choice="attention",
        blocks=2,
        neighbours=1,
        sink_blocks=1,
        window=8,
        read_from=0,
        answer_choice="question",
        select_queries=4,
    ),  # fmt: skip
    "mid-select": dict(choice="max", blocks=3, sink_blocks=1, window=12, read_from=None),
    "streaming": dict(choice="none", sink_blocks=1, window=20),
    "window": dict(choice="none", sink_blocks=0, window=24),
}


@torch.no_grad()
def measure() -> dict[str, torch.Tensor]:
    from tiny_hf import V, tiny_base

    from inftyformer.retrieval import RetrievalLM

    out = {}
    for name, row in ROWS.items():
        for positions in (64, 512):
            torch.manual_seed(0)
            base = tiny_base("llama", max_position_embeddings=positions, num_hidden_layers=4)
            model = RetrievalLM(base, **SCALE, **row).eval()
            ids = torch.randint(1, V, (2, 150), generator=torch.Generator().manual_seed(1))
            read = model(ids[:, :100])
            asked = model(ids[:, 100:137], read.state, reselect=True)
            new, state = model.generate(ids[:, 137:], 6, temperature=0, state=asked.state)
            after = model(ids[:, 140:141], state)
            key = f"{name}/{positions}"
            out |= {f"{key}/stream": read.logits, f"{key}/reselect": asked.logits,
                    f"{key}/generated": new, f"{key}/after": after.logits}  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the tensors here")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        before, after = (torch.load(p) for p in args.compare)
        differ = [k for k in before if k not in after or not torch.equal(before[k], after[k])]
        print(f"{len(before) - len(differ)} of {len(before)} equal; differ: {differ or 'none'}")
        return 1 if differ else 0
    if args.out is None:
        parser.error("give --out FILE or --compare BEFORE AFTER")
    tensors = measure()
    torch.save(tensors, args.out)
    print(f"wrote {len(tensors)} tensors to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
