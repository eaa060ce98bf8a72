"""The dialogue task (CMU-DoG, paper §4.3): examples laid out by hand (speaker marks and a chat
template), where the document goes (memory, context, none), the loss on reply tokens only,
generation cut at the end of a turn, evaluation sums that add up over shards, corpus BLEU from
summed statistics, and training through the trainer with a tiny native and a tiny pretrained
model. A small CMU-DoG is written in the test; the real data is used where it is present."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
import torch
from tiny_models import tiny, tiny_train
from typer.testing import CliRunner

from inftyformer.cli import app
from inftyformer.metrics import bleu_from_statistics, bleu_statistics
from inftyformer.model_kinds import build_model
from inftyformer.native.model import IGNORE_INDEX, LMOutput, MemoryLM
from inftyformer.tasks import DialogueConfig, DialogueTask, RunContext, Shard, get_task
from inftyformer.tasks.chat import DEFAULT_INSTRUCTION, find_chat_template
from inftyformer.tasks.dialogue_examples import generate_reply, pad_batch
from inftyformer.training import Trainer, evaluate_run, load_run

pytest.importorskip("sacrebleu")
EOS = 256  # the byte tokenizer's end of text
WORDS = "the movie was great i loved it toy woody buzz andy plot actor funny scene".split()


# --------------------------------------------------------------------------- a small CMU-DoG
def _document(name: str) -> dict:
    facts = {
        "movieName": name,
        "year": "1995",
        "director": "Someone",
        "genre": "Comedy",
        "cast": ["Tom as Woody"],
        "introduction": f"{name} is a film about toys.",
        "rating": ["92%"],
        "critical_response": ["Fun."],
    }
    plot = [f"Part {i} of the plot of {name}: " + "woody and buzz " * 6 for i in (1, 2, 3)]
    return {"file": f"{name}.json", "sections": {"0": facts, "1": plot[0], "2": plot[1],
                                                 "3": plot[2]}}  # fmt: skip


def _conversation(cid: str, doc: int, turns: list[tuple[str, int, str]]) -> dict:
    return {
        "id": cid,
        "wikiDocumentIdx": doc,
        "rating": 2,
        "status": 1,
        "whoSawDoc": ["user1"],
        "turns": [{"uid": u, "docIdx": s, "text": t} for u, s, t in turns],
    }


def _random_turns(seed: int, n: int) -> list[tuple[str, int, str]]:
    rng = random.Random(seed)
    return [
        (rng.choice(["user1", "user2"]), rng.randint(0, 3),
         " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 6))))
        for _ in range(n)
    ]  # fmt: skip


HAND = [  # the conversation the layouts are checked on by hand
    ("user1", 0, "hi"),
    ("user2", 0, "hello there"),
    ("user1", 1, "did you like it"),
    ("user1", 1, "  woody?  "),
    ("user2", 2, "yes a lot"),
]


def write_cmu_dog(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    docs = {str(i): _document(name) for i, name in enumerate(["Toy Story", "Up", "Cars"])}
    (root / "docs.json").write_text(json.dumps(docs), encoding="utf-8")
    splits = {
        "train": [_conversation(f"t{i}", i % 3, _random_turns(i, 8)) for i in range(6)],
        "valid": [_conversation(f"v{i}", i % 3, _random_turns(50 + i, 7)) for i in range(3)],
        "test": [_conversation("hand", 0, HAND)]
        + [_conversation(f"s{i}", i % 3, _random_turns(90 + i, 7)) for i in range(3)],
    }
    splits["train"].append(splits["test"][1])  # a conversation in train and test: dropped
    for split, conversations in splits.items():
        lines = "\n".join(json.dumps(c) for c in conversations)
        (root / f"{split}.jsonl").write_text(lines + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_cmu_dog(tmp_path_factory.mktemp("cmu") / "cmu-dog")


def save_chat_model(directory: Path, config_template: bool = False) -> Path:
    """A byte-level BPE with ChatML special tokens and a chat template, and a tiny random
    Llama of its vocabulary (nothing is downloaded)."""
    from tiny_pretrained import write_tiny_model

    corpus = [" ".join(WORDS)] * 20 + ["system user assistant"] * 5
    return write_tiny_model(directory, chat=True, corpus=corpus, vocab_size=320,
                            max_positions=512, template_in_config=config_template)  # fmt: skip


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    pytest.importorskip("transformers")
    return save_chat_model(tmp_path_factory.mktemp("chat") / "base")


def native(segment_len: int = 96, model_type: str = "infty", **overrides):
    settings = {"vocab_size": 257, "segment_len": segment_len, "mem_len": 16, **overrides}
    return tiny(model_type, **settings)


def task(data: Path, model_config=None, batch_size: int = 2, **settings) -> DialogueTask:
    settings = {"tokenizer": "bytes", "max_context": 40, "max_reply": 24, "max_new_tokens": 12,
                **settings}  # fmt: skip
    config = DialogueConfig(data_dir=str(data), **settings)
    return DialogueTask(config, model_config or native(), RunContext(batch_size, seed=0))


def hand_example(t: DialogueTask, reply_index: int = 4):
    return next(
        e
        for e in t.examples("test")
        if e.conversation_id == "hand" and e.reply_index == reply_index
    )


# --------------------------------------------------------------------------- layouts by hand
def test_speaker_marks_layout_by_hand(data):
    t = task(data, placement="none", min_history=1, max_context=200)
    assert t.format.name == "marks" and t.format.eot == EOS
    e = t.encode(hand_example(t))  # the reply "yes a lot" by user2: user2 is B, user1 is A
    b = list(b"yes a lot")

    def enc(s: str) -> list[int]:
        return list(s.encode())

    history = (enc("A: hi") + [EOS] + enc("B: hello there") + [EOS] + enc("A: did you like it")
               + [EOS] + enc("A: woody?") + [EOS])  # fmt: skip
    assert list(e.tokens) == history + enc("B:") + enc(" ") + b + [EOS]
    assert e.prompt_len == len(history) + 2
    assert e.memory == () and e.reference == "yes a lot" and e.previous == "woody?"
    # position t predicts tokens[t + 1]; only the reply and its end of turn are targets
    assert len(e.inputs) == len(e.targets) == len(e.tokens) - 1
    scored = [(i, y) for i, y in enumerate(e.targets) if y != IGNORE_INDEX]
    assert [y for _, y in scored] == enc(" yes a lot") + [EOS]
    assert scored[0][0] == e.prompt_len - 1
    # the reply of user1 (index 3): the roles swap
    e3 = t.encode(hand_example(t, 3))
    assert (
        bytes(e3.tokens[:5]) == b"B: hi"
        and bytes(e3.tokens[e3.prompt_len - 2 : e3.prompt_len]) == b"B:"
    )


def test_chat_template_layout_by_hand(data, chat_model):
    t = task(data, native(256, vocab_size=320), tokenizer=str(chat_model), placement="none",
             min_history=1, max_context=200, max_reply=30)  # fmt: skip
    assert t.format.name == "chat" and t.format.instruction == DEFAULT_INSTRUCTION
    eot = t.tokenizer.encode("<|im_end|>")
    assert t.format.eot == eot[0] and len(eot) == 1
    e = t.encode(hand_example(t))
    text = t.tokenizer.decode(list(e.tokens))
    expected = (
        f"<|im_start|>system\n{DEFAULT_INSTRUCTION}<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello there<|im_end|>\n"
        "<|im_start|>user\ndid you like it<|im_end|>\n"
        "<|im_start|>user\nwoody?<|im_end|>\n"
        "<|im_start|>assistant\nyes a lot<|im_end|>"
    )
    assert text == expected
    prompt = t.tokenizer.decode(list(e.tokens[: e.prompt_len]))
    assert prompt == expected[: -len("yes a lot<|im_end|>")]
    targets = [y for y in e.targets if y != IGNORE_INDEX]
    assert t.tokenizer.decode(targets) == "yes a lot<|im_end|>" and targets[-1] == t.format.eot


def test_chat_template_is_found_in_tokenizer_config(tmp_path):
    pytest.importorskip("transformers")
    directory = save_chat_model(tmp_path / "m", config_template=True)
    from tiny_pretrained import CHATML

    assert find_chat_template(directory) == CHATML
    assert find_chat_template(tmp_path) is None
    assert find_chat_template(None) is None


def test_history_keeps_the_newest_whole_turns_and_the_reply_room(data):
    t = task(data, placement="none", min_history=1, max_context=28)
    e = t.encode(hand_example(t))
    # "A: did you like it" (19 bytes) + "A: woody?" (10 bytes) > 28: only the last turn fits
    assert list(e.tokens[: e.prompt_len]) == list(b"A: woody?") + [EOS] + list(b"B:")
    # the prompt does not depend on the reply's length (max_reply is kept free)
    t2 = task(data, native(40), placement="none", min_history=1, max_context=28)
    short = t2.encode(hand_example(t2))
    assert len(short.tokens[: short.prompt_len]) <= 40 - 24
    with pytest.raises(ValueError, match="no room for the history"):
        task(data, native(26), placement="none").encode(hand_example(t))


def test_document_placements(data):
    memory = task(data, placement="memory")
    context = task(data, placement="context")
    none = task(data, placement="none")
    example = hand_example(memory)
    doc = "\n\n".join(example.document)
    em, ec, en = memory.encode(example), context.encode(example), none.encode(example)
    # memory: the document (+ end of text) goes to the memory; the window is the one of "none"
    assert bytes(em.memory[:-1]).decode() == "Document:\n" + doc and em.memory[-1] == EOS
    assert em.tokens == en.tokens and en.memory == ec.memory == ()
    # context: as much of the document as fits before the history, filling the segment
    head = b"Document:\n"
    assert bytes(ec.tokens[: len(head)]) == head
    kept = ec.tokens[len(head) : ec.tokens.index(EOS)]
    assert 0 < len(kept) < len(doc.encode()) and bytes(kept) == doc.encode()[: len(kept)]
    assert ec.prompt_len + 24 == 96  # prefix + history + reply prompt + the reply's room
    assert ec.tokens[len(head) + len(kept) + 1 :] == en.tokens
    # grounding "section": the section in view when the reply was written (section 2 here)
    section = task(data, grounding="section").encode(hand_example(task(data, grounding="section")))
    assert bytes(section.memory[:-1]).decode() == "Document:\n" + example.document[2]
    # the control: another movie's document
    other = task(data, other_document=True)
    assert "Up (1995)" in bytes(other.encode(hand_example(other)).memory[:-1]).decode()


def test_the_document_in_memory_changes_the_reply_scores(data):
    torch.manual_seed(0)
    model = build_model(native()).eval()
    t_mem, t_none = task(data, placement="memory"), task(data, placement="none")
    e = t_mem.encode(hand_example(t_mem))
    inputs, targets = pad_batch([e], EOS)
    state = t_mem._state(model, e.memory, 1)
    with_doc = model(inputs, state=state, targets=targets)
    without = model(inputs, targets=targets)
    assert state is not None and state.layers[0].long_term.coefficients.abs().sum() > 0
    assert not torch.allclose(with_doc.logits, without.logits)
    # the loss counts the reply tokens only: equal to a hand cross-entropy over them
    mask = targets != IGNORE_INDEX
    hand = torch.nn.functional.cross_entropy(with_doc.logits[mask], targets[mask])
    assert torch.allclose(with_doc.lm_loss, hand)
    assert int(mask.sum()) == len(b" yes a lot") + 1
    assert bool((with_doc.token_loss[~mask] == 0).all())
    # a batch from the task holds one document's examples
    batch = t_mem.batch(3)
    assert len({r.key for r in batch.examples}) == 1 and batch.memory == batch.examples[0].memory
    assert t_none.batch(3).memory == () and t_mem.batch(3) == t_mem.batch(3)  # seed and step only
    # micro-batches of a step stream the document once, into the memory a fresh push gives
    for rows in (slice(0, 1), slice(1, 2)):
        t_mem.loss(model, batch, rows, rows.start)
        cached = batch.document_state
    fresh = t_mem._state(model, batch.memory, 1)
    assert cached is batch.document_state
    assert all(torch.equal(v, fresh.tensors()[k]) for k, v in cached.tensors().items())


def test_pad_batch_and_repeat_rows(data):
    t = task(data, placement="memory")
    rows = [t.encode(e) for e in t.examples("test")[:3]]
    inputs, targets = pad_batch(rows, EOS)
    for i, row in enumerate(rows):
        n = len(row.tokens) - 1
        assert inputs[i, :n].tolist() == row.inputs and targets[i, :n].tolist() == row.targets
        assert bool((targets[i, n:] == IGNORE_INDEX).all()) and bool((inputs[i, n:] == EOS).all())
    model = build_model(native()).eval()
    state = t._state(model, rows[0].memory, 1)
    three = state.repeat_rows(3)
    assert three.batch_size == 3
    for key, value in three.tensors().items():
        assert torch.equal(value[2], state.tensors()[key][0])
    # right padding changes nothing for the real tokens
    alone = model(torch.tensor([rows[1].inputs]), state=state).logits[0]
    padded = model(inputs, state=three).logits[1, : len(rows[1].inputs)]
    assert torch.allclose(alone, padded, atol=1e-5)


# --------------------------------------------------------------------------- generation
class ScriptedModel(torch.nn.Module):
    """A model whose greedy continuation is `script`, whatever the input."""

    def __init__(self, script: list[int], vocab: int = 257) -> None:
        super().__init__()
        self.config = native()
        self.script, self.vocab, self.calls = script, vocab, 0
        self.weight = torch.nn.Parameter(torch.zeros(1))

    generate = MemoryLM.generate  # the native model's generation over this forward

    def forward(self, tokens, state=None, targets=None, reset=None, generator=None):
        logits = torch.zeros(tokens.shape[0], tokens.shape[1], self.vocab)
        logits[:, -1, self.script[min(self.calls, len(self.script) - 1)]] = 10.0
        self.calls += 1
        return LMOutput(logits=logits, state=state)


def test_generation_is_cut_at_the_end_of_turn():
    model = ScriptedModel([5, 6, EOS, 7, 8])
    new = generate_reply(model, [1, 2, 3], None, [EOS], max_new_tokens=5, temperature=0.0,
                         top_p=0.9, seed=0)  # fmt: skip
    assert new == [5, 6]
    model = ScriptedModel([5, 6, 7])
    new = generate_reply(model, [1], None, [EOS], max_new_tokens=4, temperature=0.0, top_p=1.0,
                         seed=0)  # fmt: skip
    assert new == [5, 6, 7, 7]  # no end of turn: max_new_tokens


def test_sampling_is_seeded_per_example(data):
    torch.manual_seed(0)
    model = build_model(native()).eval()
    t = task(data)
    e = t.encode(hand_example(t))
    state = t._state(model, e.memory, 1)
    before = torch.random.get_rng_state()

    def sample(seed):
        return generate_reply(model, e.tokens[: e.prompt_len], state, [EOS], max_new_tokens=12,
                              temperature=1.0, top_p=0.9, seed=seed)  # fmt: skip

    assert sample(3) == sample(3) and sample(3) != sample(4)
    assert torch.equal(torch.random.get_rng_state(), before)  # the global generator is restored


# --------------------------------------------------------------------------- evaluation
def test_bleu_from_summed_statistics_is_sacrebleu_corpus_bleu():
    import sacrebleu

    rng = random.Random(0)
    refs = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(12)]
    preds = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 9))) for _ in range(12)]
    preds[3] = refs[3]  # some higher-order matches
    total: dict[str, float] = {}
    for part in (slice(0, 5), slice(5, 12)):
        for key, value in bleu_statistics(preds[part], refs[part]).items():
            total[key] = total.get(key, 0.0) + value
    expected = sacrebleu.corpus_bleu(preds, [refs]).score
    assert expected > 0 and bleu_from_statistics(total) == pytest.approx(expected, rel=1e-12)
    assert math.isnan(bleu_from_statistics({}))


@pytest.fixture(scope="module")
def scored(data):
    """One evaluation of a tiny native ∞-former on 6 test examples, as one shard and as two."""
    torch.manual_seed(0)
    model = build_model(native()).eval()
    t = task(data, batch_size=2, eval_examples=6)
    whole = t.evaluate(model, "test", None, Shard())
    parts = [t.evaluate(model, "test", None, Shard(i, 2)) for i in range(2)]
    return t, whole, parts


def test_evaluation_sums_add_up_over_shards(scored):
    t, whole, parts = scored
    total: dict[str, float] = {}
    for part in parts:
        for key, value in part.sums.items():
            total[key] = total.get(key, 0.0) + value
    assert set(total) == set(whole.sums)
    for key, value in whole.sums.items():
        assert total[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    a, b = t.eval_metrics(total), t.eval_metrics(whole.sums)
    assert a == pytest.approx(b, rel=1e-5)
    assert b["examples"] == b["generated"] == 6
    predictions = sorted(d["prediction"] for p in parts for d in p.details["examples"])
    assert predictions == sorted(d["prediction"] for d in whole.details["examples"])


def test_evaluation_metrics_are_the_dialogue_scores(scored):
    from inftyformer.metrics import dialogue_scores

    t, whole, _ = scored
    details = whole.details["examples"]
    metrics = t.eval_metrics(whole.sums)
    expected = dialogue_scores([d["prediction"] for d in details],
                               [d["reference"] for d in details])  # fmt: skip
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    assert metrics["loss"] == pytest.approx(
        sum(d["nll"] for d in details) / sum(d["reply_tokens"] for d in details), rel=1e-5
    )
    for d in details:  # cut at the end of turn, at most max_new_tokens
        assert d["new_tokens"] <= 12 and d["reference"] == d["reference"].strip()
        assert {"f1", "meteor", "rougeL", "conversation_id", "reply_index", "previous"} <= set(d)
    assert whole.details["generation"] == {"top_p": 0.9, "temperature": 1.0,
                                           "max_new_tokens": 12, "seed": 0}  # fmt: skip


def test_evaluation_subset_and_valid_bound(data):
    t = task(data, batch_size=2, eval_examples=5)
    subset = t.eval_subset("test", None)
    assert len(subset) == 5 and subset == t.eval_subset("test", 1)  # test: the whole subset
    assert all(e.reply_index >= 3 for e in subset)  # from the fourth utterance on
    assert len(t.eval_subset("valid", 1)) == 2  # valid: num_batches × batch_size
    model = build_model(native()).eval()
    ev = task(data, batch_size=2, generate=False).evaluate(model, "valid", 1, Shard())
    metrics = t.eval_metrics(ev.sums)
    assert metrics["examples"] == 2 and metrics["ppl"] > 1
    assert "f1" not in metrics and "bleu" not in metrics  # no reply generated: no reply scores
    # training never sees a conversation that valid or test holds
    train_ids = {e.conversation_id for e in t.examples("train")}
    assert "s0" not in train_ids and len(train_ids) == 6


# --------------------------------------------------------------------------- settings
def test_settings_are_checked(data):
    with pytest.raises(ValueError, match="placement"):
        DialogueConfig(placement="window")
    with pytest.raises(ValueError, match="max_new_tokens"):
        DialogueConfig(max_new_tokens=80, max_reply=64)
    with pytest.raises(ValueError, match="top_p"):
        DialogueConfig(top_p=0.0)
    config = DialogueConfig(data_dir=str(data), tokenizer="bytes")
    with pytest.raises(ValueError, match="needs a model with memory"):
        DialogueTask.check(config, native(model_type="transformer", mem_len=0))
    with pytest.raises(ValueError, match="leaves no room"):
        DialogueTask.check(config, native(segment_len=64))
    with pytest.raises(FileNotFoundError):
        DialogueTask.check(DialogueConfig(data_dir=str(data.parent / "nowhere")), native())
    with pytest.raises(ValueError, match="no chat template"):
        task(data, speaker_format="chat")
    assert get_task("dialogue") is DialogueTask


# --------------------------------------------------------------------------- training
def test_a_native_model_trains_through_the_command_line(data, tmp_path):
    args = ["train", "dialogue", "--data-dir", str(data), "--tokenizer", "bytes",
            "--set", "d_model=16", "--set", "n_layers=1", "--set", "segment_len=96",
            "--set", "mem_len=16", "--set", "num_basis=8", "--set", "num_samples=8",
            "--set", "max_context=40", "--set", "max_reply=24", "--set", "max_new_tokens=8",
            "--set", "eval_examples=3", "--set", "eval_batches=1", "--set", "test_batches=1",
            "--steps", "2", "--batch-size", "2", "--eval-every", "2", "--no-progress",
            "--set", "tensorboard=false", "--out-dir", str(tmp_path)]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert re.search(r"test ppl [\d.]+, f1 [\d.]+, rougeL [\d.]+", result.output), result.output
    out = tmp_path / "eval.json"
    result = runner.invoke(app, ["evaluate", str(tmp_path), "--set", "placement=none",
                                 "--json", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(out.read_text())
    assert payload["task_config"]["placement"] == "none"
    assert len(payload["details"]["examples"]) == 3
    assert {"prediction", "reference", "f1"} <= set(payload["details"]["examples"][0])


def test_a_pretrained_model_with_a_chat_template_trains_and_evaluates(data, chat_model, tmp_path):
    from inftyformer.model_kinds import PretrainedMemoryConfig

    model = PretrainedMemoryConfig(base_model=str(chat_model), segment_len=192, num_basis=8,
                                   num_samples=8, freeze_base=True)  # fmt: skip
    # teacher-forced while training (the valid check must not read absent reply scores as NaN)
    config = DialogueConfig(data_dir=str(data), tokenizer=str(chat_model), max_context=48,
                            max_reply=24, max_new_tokens=8, eval_examples=3,
                            generate=False)  # fmt: skip
    run = tiny_train(tmp_path, task="dialogue", steps=2, batch_size=2, eval_every=2,
                     warmup_steps=1)  # fmt: skip
    result = Trainer(run, config, model, echo=lambda s: None).fit()
    assert result.finished and "f1" not in result.test and result.test["loss"] > 0
    for placement in ("memory", "context", "none"):
        settings = {"placement": placement, "generate": True}
        metrics, evaluation, t = evaluate_run(tmp_path, task_settings=settings)
        assert t.format.name == "chat" and metrics["examples"] == 3
        assert metrics["generated"] == 3 and math.isfinite(metrics["f1"])
        for d in evaluation.details["examples"]:
            assert "<|im_end|>" not in d["prediction"] and d["new_tokens"] <= 8
            assert (d["memory_tokens"] > 0) == (placement == "memory")
    # the memory trained, the frozen base did not
    saved = load_run(tmp_path).model.state_dict()
    start = build_model(model).state_dict()
    assert all(torch.equal(saved[k], start[k]) for k in start if k.startswith("lm.base."))
    assert any(not torch.equal(saved[k], start[k]) for k in start if "long_term" in k)


# --------------------------------------------------------------------------- the real data
def test_real_cmu_dog_examples(shared_data):
    t = DialogueTask(DialogueConfig(tokenizer="gpt2", eval_examples=8),
                     native(512, vocab_size=50257), RunContext(4, seed=0))  # fmt: skip
    test = t.examples("test")
    assert len(test) == 17532  # every test turn from the fourth on with text
    subset = t.eval_subset("test", None)
    assert len(subset) == 8 and subset == t.eval_subset("test", None)
    train = t.examples("train")
    held_out = {e.conversation_id for e in test} | {e.conversation_id for e in t.examples("valid")}
    assert not held_out & {e.conversation_id for e in train}
    for example in subset:
        e = t.encode(example)
        assert len(e.tokens) <= 512 and e.memory[-1] == t.tokenizer.eos_id
        assert t.tokenizer.decode(list(e.memory)).startswith("Document:\n")
        assert e.tokens[e.prompt_len - 2 :][:2] == tuple(t.tokenizer.encode("B:"))


def test_the_data_fingerprint_follows_each_splits_files(data, tmp_path):
    import shutil

    copy = tmp_path / "cmu-dog"
    shutil.copytree(data, copy)
    before = task(copy).data_fingerprint(["train", "valid", "test"])
    lines = (copy / "test.jsonl").read_text().splitlines()
    (copy / "test.jsonl").write_text("\n".join(lines[::-1]) + "\n")  # same conversations, reordered
    after = task(copy).data_fingerprint(["train", "valid", "test"])
    assert after["valid"] == before["valid"]
    assert after["test"] != before["test"] and after["train"] != before["train"]  # held out
    (copy / "test.jsonl").write_text("")
    with pytest.raises(ValueError, match="the test split of CMU-DoG gives no examples"):
        task(copy).check_data(["valid", "test"])
