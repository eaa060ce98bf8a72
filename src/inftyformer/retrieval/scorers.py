"""Which stored blocks a retrieval memory reads (`model.py`, module doc "Which blocks"): the
choice strategies behind the `choice` seam (`config.py`), each block's score [b, n] against a
call's queries (the stored keys read in parts of `PART` tokens, so that no [queries × all
tokens] tensor is ever whole), and the `k` blocks chosen by it.

    kind        a block's score                                          `ScoredChoice` settings
    "max"       its best q · k / √d over the call's queries, heads and   blocks, neighbours,
                its tokens                                               select_layer, read_from,
    "attention" its best attention weight from any of the call's         select_queries,
                queries and heads attending over every stored token      answer_choice;
                (among the `shortlist` blocks of best q · k)             shortlist
    "question"  a stream's call as "max", a question's as "attention"    question_blocks,
                with few blocks, after its window is cut, at a later     _neighbours, _shortlist,
                block of the base                                        _window, _layout,
                                                                         _select_layer
    "none"      no past block is read (the baselines: sink and window)   –
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._checks import check_positive_int
from ..core.seams import Strategy, kinds, lookup, register

ANSWER_CHOICES = ("own", "question")
PART = 4096  # stored tokens scored at once


def parts(keys: torch.Tensor | Sequence[torch.Tensor], block: int) -> list[torch.Tensor]:
    """The stored keys [b, n·B, Hkv, d], or their chunks (`RetrievalState.keys`), in parts
    of whole blocks of at most about `PART` tokens, in stream order."""
    if isinstance(keys, torch.Tensor):
        return list(keys.split(max(1, PART // block) * block, 1))
    return [p for chunk in keys for p in parts(chunk, block)]


def block_scores(
    query: torch.Tensor, keys: torch.Tensor | Sequence[torch.Tensor], stored: torch.Tensor,
    kv_heads: int, block: int, choice: ScoredChoice,
) -> torch.Tensor:  # fmt: skip
    """Every stored block's score [b, n] under the queries [b, H, T, d] (the grouped-query
    heads kept grouped over `kv_heads`) by `choice`, against the stored keys [b, n·B, Hkv, d]
    of blocks of B = `block` tokens (or their chunks along the tokens, `RetrievalState.keys`);
    −inf where `stored` [b, n] is False (a row holding fewer blocks)."""
    b, H, T, d = query.shape
    n = stored.shape[1]
    split = parts(keys, block)
    tokens = sum(p.shape[1] for p in split)
    if tokens != n * block:
        raise ValueError(f"{n} blocks of {block} stored, but keys for {tokens} tokens")
    if n == 0:
        return torch.zeros(b, 0, device=query.device)
    q = query.float().view(b, kv_heads, H // kv_heads, T, d) / math.sqrt(d)
    return choice.scores(q, split, stored, block).masked_fill(~stored, -math.inf)


def max_score(q: torch.Tensor, split: Sequence[torch.Tensor], block: int) -> torch.Tensor:
    """choice "max": each block's best q · k over the queries q [b, Hkv, G, T, d] (scaled),
    heads and its tokens → [b, n]."""
    best = []  # each part's blocks' scores  [b, n'/B]
    for s in part_scores(q, split):  # [b, Hkv, G, T, n']
        best.append(s.amax((1, 2, 3)).unflatten(1, (-1, block)).amax(-1))
    return torch.cat(best, 1)


def part_scores(q: torch.Tensor, split: Sequence[torch.Tensor]) -> Iterator[torch.Tensor]:
    """q · k [b, Hkv, G, T, n'] of the queries q [b, Hkv, G, T, d] (scaled) against each part
    [b, n', Hkv, d] of the stored keys in turn, each written over the last (use one before
    asking for the next). The scores and the keys in float32 live in two buffers made once per
    call at the largest part's size: the same sizes call after call however long the stream,
    where a part's own tensors would grow a little every call (the last part fills up) and
    leave the allocator a hole too small for the next call's, the process's resident memory
    creeping up with the stream."""
    b, Hkv, G, T, d = q.shape
    width = max((p.shape[1] for p in split), default=0)
    scores = q.new_empty(b * Hkv * G * T * width)
    keys = q.new_empty(b * Hkv * width * d)
    queries = q.reshape(b, Hkv, G * T, d)
    for part in split:
        m = part.shape[1]
        k = keys[: b * Hkv * m * d].view(b, Hkv, m, d)
        k.copy_(part.transpose(1, 2))  # float16 → float32, heads first
        s = scores[: b * Hkv * G * T * m].view(b, Hkv, G * T, m)
        torch.matmul(queries, k.transpose(-1, -2), out=s)
        yield s.view(b, Hkv, G, T, m)


def attention_score(
    q: torch.Tensor, keys: torch.Tensor | Sequence[torch.Tensor], stored: torch.Tensor,
    block: int, shortlist: int = 0,
) -> torch.Tensor:  # fmt: skip
    """choice "attention": each block's best attention weight from any of the call's queries
    and heads when that query attends over every stored token alone,
    max_{h,t} max_{j ∈ block} exp(q_ht · k_j − log Σ_{j' stored} exp(q_ht · k_j')),
    in logs. A query that matches many blocks alike (a word every needle shares) spreads its
    weight over them; one that matches a single block (the asked key) gives it nearly all.
    With `shortlist`, only the `shortlist` blocks of best q · k (the "max" score) keep their
    weight, the rest −inf: a head that pays a block weight whatever is asked (a chapter
    heading some heads attend to from any query, where nothing else draws them) wins on
    weight alone but not on q · k, which the head that matches the asked words decides.
    q [b, Hkv, G, T, d] (scaled), keys [b, n·B, Hkv, d] (or their chunks), stored [b, n] →
    [b, n]; one pass over the keys in `parts`, keeping each part's log-sum-exp and its blocks'
    best raw scores per query ([b, Hkv, G, T, n]: B times smaller than the scores)."""
    valid = stored.repeat_interleave(block, 1)  # [b, n·B]
    lse, block_max = [], []
    split = parts(keys, block)
    sizes = [p.shape[1] for p in split]
    for s, ok in zip(part_scores(q, split), valid.split(sizes, 1), strict=True):
        s.masked_fill_(~ok[:, None, None, None], -math.inf)  # [b, Hkv, G, T, n']
        lse.append(torch.logsumexp(s, -1))  # [b, Hkv, G, T]
        block_max.append(s.unflatten(-1, (-1, block)).amax(-1))  # [b, Hkv, G, T, n'/B]
    total = torch.logsumexp(torch.stack(lse, -1), -1)  # [b, Hkv, G, T]
    raw = torch.cat(block_max, -1)  # each block's best q · k per head and query
    weight = raw - total[..., None]  # log attention, [b, Hkv, G, T, n]
    weight = weight.masked_fill(weight.isnan(), -math.inf)  # nothing stored: −inf − (−inf)
    weight = weight.amax((1, 2, 3))  # [b, n]
    n = weight.shape[1]
    if shortlist and shortlist < n:  # the blocks of best q · k keep their weight
        best = raw.amax((1, 2, 3))  # "max" (−inf where not stored): [b, n]
        kept = torch.zeros_like(stored).scatter(1, best.topk(shortlist, 1).indices, True)
        weight = weight.masked_fill(~kept, -math.inf)
    return weight


def choose(
    score: torch.Tensor, stored: torch.Tensor, k: int, neighbours: int, layout: Any
) -> torch.Tensor:
    """The `k` best blocks [b, k] by `score` [b, n] (`stored` [b, n]: a row's blocks; where
    it holds fewer than k, unstored ones fill the rest): with `neighbours`, the best k / (1 +
    neighbours) first, each with the blocks right after it, then the next best; in the order
    `layout` reads them (`layouts.py`), from stream order and each block's rank (a neighbour
    ranks with its lead)."""
    n = score.shape[1]
    rank = score  # what orders the chosen blocks by score  [b, n]
    if neighbours:
        m = neighbours + 1
        lead = score.topk(max(1, k // m), dim=1)  # [b, k']
        follow = lead.indices[:, :, None] + torch.arange(m, device=score.device)  # [b, k', m]
        follow = follow.flatten(1).clamp(max=n - 1)
        first = torch.zeros_like(stored).scatter(1, follow, True) & stored
        # a neighbour ranks with its lead (the best lead holding it), read right after it
        group = torch.full_like(score, -math.inf).scatter_reduce(
            1, follow, lead.values.repeat_interleave(m, 1), "amax"
        )  # fmt: skip
        rank = torch.maximum(score, group)
        score = score.masked_fill(first, math.inf)  # then the next best fill what is left
    order = score.topk(k, dim=1).indices.sort(1).values  # stream order
    return layout.arrange(order, rank)


def check_shortlist(name: str, shortlist: int, blocks_name: str, blocks: int) -> None:
    """A shortlist is 0 (none) or holds at least the blocks chosen from it."""
    check_positive_int(name, shortlist, minimum=0)
    if 0 < shortlist < blocks:
        least = f"0 or at least {blocks_name} ({blocks})"
        raise ValueError(f"{name} ({shortlist}) must be {least}: the blocks are chosen from it")


# ---------------------------------------------------------------------- the choice strategies
@dataclass(frozen=True)
class ScoredChoice(Strategy):
    """A choice that scores the stored blocks (the kinds below): at block `select_layer` of the
    base (None: its middle block) each call scores every stored block with its last
    `select_queries` queries (0: all of them) and reads the `blocks` best, each with the
    `neighbours` blocks right after it, in every block of the base from `read_from` on (None:
    from `select_layer`; below it a block reads what the previous call chose). While an answer
    is generated, each new token chooses its own blocks (`answer_choice="own"`) or reads the
    blocks its prompt's last call chose ("question")."""

    seam: ClassVar[str] = "choice"
    # a question's call (reselect) first chooses as a stream's call, then its own blocks with
    # the queries of a pass that read those, and reads that choice in every block; otherwise
    # it chooses once in a first pass and again at `select_layer` of the call itself
    question_after_stream: ClassVar[bool] = False
    blocks: int = 16
    neighbours: int = 0
    select_layer: int | None = None
    read_from: int | None = None
    select_queries: int = 0
    answer_choice: str = "own"

    def __post_init__(self) -> None:
        if self.blocks == 0 and not isinstance(self.blocks, bool):
            raise ValueError(f"blocks must be >= 1 for choice {self.kind!r}; to read no past "
                             "blocks choose choice='none' (sink and window only)")  # fmt: skip
        check_positive_int("blocks", self.blocks)
        for name in ("neighbours", "select_queries"):
            check_positive_int(name, getattr(self, name), minimum=0)
        for name in ("select_layer", "read_from"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name), minimum=0)
        if self.answer_choice not in ANSWER_CHOICES:
            raise ValueError(
                f"answer_choice must be one of {ANSWER_CHOICES}, got {self.answer_choice!r}"
            )

    def scores(
        self, q: torch.Tensor, split: Sequence[torch.Tensor], stored: torch.Tensor, block: int
    ) -> torch.Tensor:
        """Each block's score [b, n] under the queries q [b, Hkv, G, T, d] (scaled)."""
        raise NotImplementedError

    def for_call(self, question: bool) -> ScoredChoice:
        """The choice a call makes: a question's (the last call of a prompt whose answer is
        read next, `reselect`) or a stream's; the same for every kind but "question"."""
        return self

    def layout_for(self, question: bool, layout: Strategy) -> Strategy:
        """Where a call's chosen blocks sit: the config's `layout`, but a question's under
        choice "question" (its `question_layout`)."""
        return layout

    def question_layer(self, num_layers: int, select_layer: int) -> int:
        """The block of a base of `num_layers` where a question chooses: `select_layer`, but
        under choice "question" its `question_select_layer`."""
        return select_layer


@register
@dataclass(frozen=True)
class MaxChoice(ScoredChoice):
    """A block's score: its best q · k / √d over the call's queries, heads and its tokens."""

    kind: ClassVar[str] = "max"

    def scores(self, q, split, stored, block):
        return max_score(q, split, block)


@register
@dataclass(frozen=True)
class AttentionChoice(ScoredChoice):
    """A block's score: the best attention weight any of the call's queries and heads gives
    one of its tokens attending over all the stored tokens (`attention_score`): a query
    matching many blocks alike counts less than one matching a single block."""

    kind: ClassVar[str] = "attention"
    shortlist: int = 0  # choose among the blocks of best q · k only (0: among all)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_shortlist("shortlist", self.shortlist, "blocks", self.blocks)

    def scores(self, q, split, stored, block):
        return attention_score(q, split, stored, block, self.shortlist)


@register
@dataclass(frozen=True)
class QuestionChoice(ScoredChoice):
    """A call that knows what it is: a stream's call reads the `blocks` best by their best
    q · k (as "max", with all its queries), a question's call (`reselect`: the prompt's last,
    whose answer is read next) the `question_blocks` best by attention weight from its last
    `select_queries` queries (among the `question_shortlist` of best q · k; 0, the default:
    among all), each lead with `question_neighbours` blocks after it (as "attention"): one
    fact among alike ones, where a stream needs many blocks read. A block that some head
    attends to from any query (a chapter heading) may win on attention weight: the second
    lead and the best's place next to the window (below) answer that; a shortlist (8, measured
    before them) no longer helps (docs/results/question_choices: 2 multikey prompts lost at
    4K, none won). Before it chooses, a question's call cuts the window to its last
    `question_window` … + B − 1 tokens (None: the whole window), the older whole blocks stored
    (`state.shrink_window`): an alike fact still in the window would be read beside the chosen
    one (the most recent is the one a small model copies), and the asked one there is chosen
    from the store like any other. A stream that the sink and window still hold whole (no
    block stored yet) is not cut: its question reads all of it, as the base would.
    The question's blocks sit by `question_layout` ("nearest": the best read last, next to
    the window, where a small model looks first; its stream's by the config's layout).
    A question chooses at block `question_select_layer` of the base, its queries against the
    stored keys of that block (read from the store for the call; None: three fifths of the
    base's blocks): the middle block's keys of a text read with a long window hold the alike
    facts around them, and a later block's tell the asked one apart (docs/results/
    question_choices, row `question-late`)."""

    kind: ClassVar[str] = "question"
    # few blocks read: queries that read only them drift from what chose them (a question's
    # lower blocks reading the needle's block and its neighbour chose a chapter's opening next)
    question_after_stream: ClassVar[bool] = True
    select_queries: int = 32
    answer_choice: str = "question"
    # the blocks a question reads (None: 4, 2 leads, one may win the weight without holding
    # the fact; at most `blocks`)
    question_blocks: int | None = None
    question_neighbours: int = 1
    question_shortlist: int = 0
    question_window: int | None = 256
    question_layout: str = "nearest"
    # where the question chooses: None, three fifths of the base's blocks (18 of SmolLM2's 30)
    question_select_layer: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.question_blocks is not None:
            check_positive_int("question_blocks", self.question_blocks)
        if self.question_select_layer is not None:
            check_positive_int("question_select_layer", self.question_select_layer, minimum=0)
        if self.question_window is not None:
            check_positive_int("question_window", self.question_window, minimum=0)
        if self.question_layout not in kinds("layout"):
            raise ValueError(f"question_layout must be one of {kinds('layout')}, "
                             f"got {self.question_layout!r}")  # fmt: skip
        check_positive_int("question_neighbours", self.question_neighbours, minimum=0)
        check_shortlist(
            "question_shortlist", self.question_shortlist, "question_blocks", self.question_reads
        )
        if self.question_reads > self.blocks:
            raise ValueError(
                f"question_blocks ({self.question_blocks}) must be at most blocks "
                f"({self.blocks}): a question reads into the slots of the stream's blocks"
            )

    @property
    def question_reads(self) -> int:
        """The blocks a question reads: `question_blocks`, or 4 (at most `blocks`)."""
        return min(4, self.blocks) if self.question_blocks is None else self.question_blocks

    def scores(self, q, split, stored, block):
        return max_score(q, split, block)

    def for_call(self, question: bool) -> ScoredChoice:
        shared = dict(select_layer=self.select_layer, read_from=self.read_from,
                      answer_choice=self.answer_choice)  # fmt: skip
        if question:
            return AttentionChoice(blocks=self.question_reads, neighbours=self.question_neighbours,
                                   select_queries=self.select_queries,
                                   shortlist=self.question_shortlist, **shared)  # fmt: skip
        return MaxChoice(blocks=self.blocks, neighbours=self.neighbours, **shared)

    def layout_for(self, question: bool, layout: Strategy) -> Strategy:
        return lookup("layout", self.question_layout)() if question else layout

    def question_layer(self, num_layers: int, select_layer: int) -> int:
        if self.question_select_layer is None:  # three fifths of the base's blocks, or the
            first = select_layer if self.read_from is None else min(self.read_from, select_layer)
            return max((3 * num_layers) // 5, first)  # first that retrieves if above them
        return self.question_select_layer


@register
@dataclass(frozen=True)
class NoChoice(Strategy):
    """No past block is read: the stream's sink and the window only (the StreamingLLM and
    window baselines). It has no settings; what a scored choice sets reads as nothing here."""

    seam: ClassVar[str] = "choice"
    kind: ClassVar[str] = "none"
    blocks: ClassVar[int] = 0
    neighbours: ClassVar[int] = 0
    select_layer: ClassVar[int | None] = None
    read_from: ClassVar[int | None] = None
    select_queries: ClassVar[int] = 0
    answer_choice: ClassVar[str] = "own"


__all__ = [
    "ANSWER_CHOICES",
    "PART",
    "AttentionChoice",
    "MaxChoice",
    "NoChoice",
    "QuestionChoice",
    "ScoredChoice",
    "attention_score",
    "block_scores",
    "choose",
    "max_score",
    "part_scores",
    "parts",
]
