"""Keep a conversation: does a chat turn recall what the user said a while back, and how does
the way a question chooses its blocks change that?

A conversation is made of CMU-DoG's test chats (real people talking about a film; one speaker
is the user, the other the assistant) in the base's chat template. Early on, the user says in
passing "By the way, the code of my THING is NNNNN." (with `--alike`, three more such facts
about other things, at other places of the conversation); `--distances` tokens of talk later,
the user asks "What is the code of my THING?". The answer is right when it holds the number.
The talk before the question is read once by the `retrieval` preset's stream, which every row
shares (the rows differ only in the turn's own call, the question's: `Chat.say` reads a user's
message so), and each row answers the question from that read:

    retrieval       the default preset (choice "question"): the turn reads 2 leads by attention
                    weight, each with its next block, chosen at block 18 of 30, and the last 256
                    tokens (the older ones of the window stored among those it chooses from)
    packed          the packed choice (`choice="max"`, the default until it chose questions):
                    the turn reads the 16 blocks its queries match best and the last 960 tokens,
                    as its stream does
    whole-window    the default keeping the whole window of 960 (`question_window=None`)
    full            the base on the whole conversation (it fits its positions)

    python experiments/chat_memory.py --base-model models/smollm2-135m --chats 25
    python experiments/chat_memory.py --quick --out /tmp/c     # a tiny random model
    python experiments/chat_memory.py --render-only

Each answer is a line of OUT/answers.jsonl as it is made (a run cut short goes on from there);
the read talk is kept under --sessions (a row added later reads nothing again). OUT/
chat_memory.json gathers the cells (share right, 95% Wilson interval, chats; each row's exact
McNemar test against the default, `retrieval`, on the same chats) and OUT/chat_memory.md is
rendered from it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from _arguments import positive_int, positive_ints
from ask_documents import mcnemar
from experiment import tiny_model_writer
from question_choices import READER, saved_read, shown  # READER: the stream every row shares
from retrieval import wilson

from inftyformer._measure import (
    command_line,
    default_base_model,
    kept_notes,
    machine_info,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "results" / "chat_memory"
ROWS = {  # row: its settings on top of READER; "full": the base alone
    "retrieval": {},
    "packed": {"choice": "max"},
    "whole-window": {"question_window": None},
    "full": None,
}
THINGS = ("bike lock", "locker", "garage", "safe", "gym bag", "storage unit", "mailbox", "desk")
BEFORE = 400  # tokens of talk before the asked fact (it is not at the sink)
QUICK = dict(block_size=8, blocks=4, sink_blocks=1, window=32, segment_len=16)


def talk(data_dir, chat: int, tokens_needed: int) -> list[tuple[str, str]]:
    """(role, text) turns of CMU-DoG's test chats from chat `chat` on, user and assistant taking
    turns (a speaker's run of messages is one turn), at least `tokens_needed` tokens long."""
    from inftyformer.data.cmu_dog import load_cmu_dog

    chats = load_cmu_dog(data_dir, "test")
    turns: list[tuple[str, str]] = []
    spent = 0
    for talked in chats[chat * 7 % len(chats) :] + chats:
        for t in talked.turns:
            role = "user" if t.speaker == "user1" else "assistant"
            text = " ".join(t.text.split())
            if turns and turns[-1][0] == role:
                turns[-1] = (role, turns[-1][1] + " " + text)
            elif turns or role == "user":
                turns.append((role, text))
            spent += len(text) // 4
        if spent >= tokens_needed * 1.3:
            break
    return turns


def conversation(tokenizer, fmt, chat: int, distance: int, alike: bool, seed: int, data_dir):
    """(ids of the talk, ids of the question's turn, code, tokens from the fact to the question):
    the asked fact said by the user after about BEFORE tokens, `distance` tokens before the
    question; its number and thing drawn from (seed, chat) alone."""
    from inftyformer.retrieval.prompts import begin_tokens, encode

    rng = random.Random(f"{seed}:{chat}")
    things, codes = rng.sample(THINGS, 4), rng.sample(range(10_000, 100_000), 4)
    turns = talk(data_dir, chat, BEFORE + distance + 200)
    said = [f"By the way, the code of my {things[i]} is {codes[i]}." for i in range(4)]
    users = [i for i, (role, _) in enumerate(turns) if role == "user"]
    pieces = {"user": fmt.after_user, "assistant": fmt.between}
    length = [len(encode(tokenizer, text + pieces[role])) for role, text in turns]
    at = {}
    where = 0
    for i in users:  # the asked fact: the first user turn after BEFORE tokens
        if sum(length[:i]) >= BEFORE:
            at[i], where = said[0], i
            break
    end = where + 1
    while end < len(turns) and sum(length[where + 1 : end]) < distance:
        end += 1
    end += turns[end - 1][0] == "user" if end < len(turns) else 0  # talk ends with an answer
    if alike:  # the other facts in other user turns, before and after the asked one
        others = [i for i in users if i < end and i != where]
        for i, fact in zip(rng.sample(others, 3), said[1:], strict=False):
            at[i] = fact
    text, ask = fmt.start, f"What is the code of my {things[0]}?"
    for i, (role, words) in enumerate(turns[:end]):
        words = f"{at[i]} {words}" if i in at else words
        text += words + (fmt.after_user if role == "user" else fmt.between)
    text = text[: -len(fmt.between)]  # the question's turn opens with it (Chat.turn_tokens)
    ids = begin_tokens(tokenizer, fmt) + encode(tokenizer, text)
    fact_end = len(encode(tokenizer, text[: text.find(said[0]) + len(said[0])]))
    return ids, encode(tokenizer, fmt.between + ask + fmt.after_user), codes[0], len(ids) - fact_end


def answer_of(row, models, base, ids, turn, folder, stop, new_tokens, tokenizer) -> dict:
    """One row's answer to the question's turn after the talk (`full`: the base on it all)."""
    from inftyformer.retrieval.ask import answer
    from inftyformer.retrieval.session import load_session

    start = time.perf_counter()
    if row == "full":
        x = torch.tensor([ids + turn])
        greedy = dict(do_sample=False, eos_token_id=sorted(stop), pad_token_id=min(stop))
        with torch.no_grad():
            out = base.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                **greedy)  # fmt: skip
        new = out[0, x.shape[1] :].tolist()
    else:
        state, _ = load_session(folder, models[row], read_only=True)
        new, state = answer(models[row], turn, state, stop=stop, max_new_tokens=new_tokens)
        state.store.close()
    words = tokenizer.decode(new, skip_special_tokens=True)
    return {"answer": words, "seconds": time.perf_counter() - start}


def summarise(answers: list[dict], rows: list[str]) -> dict:
    """Per (row, distance, alike): share right, interval, chats; against `retrieval` on the
    same chats: b (this row right alone), c (retrieval's), exact McNemar p."""
    by = {(a["row"], a["distance"], a["alike"], a["chat"]): a["right"] for a in answers}
    cells = {}
    for row, distance, alike in sorted({k[:3] for k in by}):
        mine = {k[3]: v for k, v in by.items() if k[:3] == (row, distance, alike)}
        k = sum(mine.values())
        cell = {"row": row, "distance": distance, "alike": alike, "right": k,
                "chats": len(mine), "interval": wilson(k, len(mine))}  # fmt: skip
        theirs = {c: by.get((rows[0], distance, alike, c)) for c in mine}
        pairs = [(mine[c], t) for c, t in theirs.items() if t is not None]
        if row != rows[0] and pairs:
            b, c = sum(m > t for m, t in pairs), sum(t > m for m, t in pairs)
            cell["paired"] = {"against": rows[0], "b": b, "c": c, "p": mcnemar(b, c)}
        cells[f"{row}-{distance}-{'alike' if alike else 'one'}"] = cell
    return cells


def render(data: dict, notes: str = "") -> str:
    s, cells = data["setup"], data["cells"]
    keys = sorted({(c["alike"], c["distance"]) for c in cells.values()})
    rows = [r for r in s["rows"] if any(c["row"] == r for c in cells.values())]
    gaps = {
        k: [c["gap"] for c in data["answers"] if (c["alike"], c["distance"]) == k] for k in keys
    }
    head = [f"{'4 alike facts' if a else 'one fact'}, ~{d:,} tokens back "
            f"({min(gaps[(a, d)]):,}–{max(gaps[(a, d)]):,})" for a, d in keys]  # fmt: skip
    lines = [
        "# Keep a conversation: a chat turn recalls what the user said",
        "",
        f"Base model `{s['base_model']}`; conversations of CMU-DoG's test chats in its chat "
        "template, the user's fact said early, asked about at the end (`experiments/"
        "chat_memory.py` says how they are made). Each cell: answers holding the number / "
        "chats [95% Wilson interval]; then, against `retrieval` on the same chats, only this "
        "row right : only `retrieval` right, exact McNemar p. Column heads: how far back the "
        "fact was said (tokens from its end to the question). Rendered from "
        "`chat_memory.json`.",
        "",
        "| row | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for row in rows:
        got = [cells.get(f"{row}-{d}-{'alike' if a else 'one'}") for a, d in keys]
        texts = [c and shown(c, f"{c['right']}/{c['chats']}") for c in got]
        lines.append(f"| {row} | " + " | ".join(t or "–" for t in texts) + " |")
    lines += ["", f"Command: `{data['command']}`", f"Machine: {data['machine'].get('cpu', '?')}",
              ""]  # fmt: skip
    return "\n".join(lines + ([notes, ""] if notes else []))


def run(args, rows, base_dir: str, data_dir, log: Path, answers: list[dict], settings: dict):
    """Every (distance, alike, chat, row) not yet in `log` answered and appended to it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from inftyformer.retrieval.model import RetrievalLM
    from inftyformer.retrieval.prompts import TurnFormat, stop_tokens

    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    fmt, stop = TurnFormat.of(tokenizer), stop_tokens(tokenizer, base)
    models = {r: RetrievalLM(base, preset=READER, **settings, **ROWS[r]).eval()
              for r in rows if ROWS[r] is not None}  # fmt: skip
    reader = RetrievalLM(base, preset=READER, **settings).eval()
    done = {(a["row"], a["distance"], a["alike"], a["chat"]) for a in answers}
    log.parent.mkdir(parents=True, exist_ok=True)
    for distance in args.distances:
        for chat in range(args.chats):
            todo = [r for r in rows if (r, distance, args.alike, chat) not in done]
            if not todo:
                continue
            ids, turn, code, gap = conversation(tokenizer, fmt, chat, distance, args.alike,
                                                args.seed, data_dir)  # fmt: skip
            name = f"{'alike' if args.alike else 'one'}-{distance}-{chat}-{args.seed}"
            folder = saved_read(reader, ids, Path(args.sessions) / name, "chat")
            for row in todo:
                got = answer_of(row, models, base, ids, turn, folder, stop, args.new_tokens,
                                tokenizer)  # fmt: skip
                line = {"row": row, "distance": distance, "alike": args.alike, "chat": chat,
                        "code": code, "gap": gap, "tokens": len(ids) + len(turn),
                        "right": int(str(code) in got["answer"]), **got}  # fmt: skip
                answers.append(line)
                with log.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(line) + "\n")
            print(distance, chat, gap, {a["row"]: a["right"] for a in answers[-len(todo) :]},
                  flush=True)  # fmt: skip
    return answers


def main(argv: list[str] | None = None) -> None:
    from inftyformer.data.paths import resolve_data_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default=",".join(ROWS))
    p.add_argument("--distances", type=positive_ints, default=[600, 3000])
    p.add_argument("--chats", type=positive_int, default=25)
    p.add_argument("--alike", action="store_true", help="three more facts of other things")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--new-tokens", type=positive_int, default=32)
    p.add_argument("--base-model", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--threads", type=positive_int, default=1)
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--sessions", default="runs/chat_sessions")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--quick", action="store_true", help="a tiny random model, 2 short chats")
    args = p.parse_args(argv)
    rows = args.rows.split(",")
    if unknown := [r for r in rows if r not in ROWS]:
        p.error(f"unknown rows {unknown}; known: {', '.join(ROWS)}")
    out, settings = Path(args.out), {}
    if args.quick:
        if out.resolve() == OUT.resolve():
            p.error("--quick needs an --out of its own (its tiny model's cells are not docs/'s)")
        args.base_model = str(out / "quick-model")
        if not Path(args.base_model, "config.json").exists():
            text = "By the way, the code of my garage is 48213. What is the code of my garage?"
            tiny_model_writer()(args.base_model, chat=True, corpus=[text] * 20, max_positions=1024)
        args.chats, args.distances, settings = 2, [120], QUICK
        args.sessions = str(out / "sessions")
    torch.set_num_threads(args.threads)
    base_dir = args.base_model or default_base_model()
    log = out / "answers.jsonl"
    answers = [json.loads(x) for x in log.read_text().splitlines() if x] if log.exists() else []
    if not args.render_only:
        data_dir = resolve_data_dir(args.data_dir)
        answers = run(args, rows, base_dir, data_dir, log, answers, settings)
    last = out / "chat_memory.json"
    old = json.loads(last.read_text()) if last.exists() else {}
    data = {
        "setup": {
            "base_model": Path(base_dir).name,
            "rows": rows,
            "seed": args.seed,
            "new_tokens": args.new_tokens,
            "quick": args.quick,
        },  # fmt: skip
        "command": old.get("command") if args.render_only else command_line(),
        "machine": old.get("machine") if args.render_only else machine_info(),
        "cells": summarise(answers, rows),
        "answers": answers,
    }
    write_json(last, data)
    write_text(out / "chat_memory.md", render(data, kept_notes(out / "chat_memory.md")))


if __name__ == "__main__":
    main()
