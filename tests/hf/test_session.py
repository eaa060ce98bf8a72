"""Sessions (`inftyformer.retrieval.session`): a document read once and asked again without
reading it (the same answer, only the question read), refused with another base, preset,
settings or document; a conversation that goes on across restarts as if uninterrupted; saves
that are whole or not at all."""

import json

import pytest
import torch
from ask_models import (
    DOCUMENT,
    NEW,
    QUESTION,
    SMALL,
    TEXT,
    cli_args,
    count_reads,
    run_cli,
    settings_args,
    write_chat_model,
)

from inftyformer.errors import EXIT_USAGE
from inftyformer.retrieval import session as sessions
from inftyformer.retrieval.ask import Chat, DocumentReader
from inftyformer.retrieval.store import BlockStore


@pytest.fixture
def read_tokens(monkeypatch):
    """How many tokens the model reads (its base's calls), so far."""
    return count_reads(monkeypatch)


LONG = DOCUMENT * 4  # ~660 tokens: a full chunk of 512 choosing keys


def test_a_session_answers_as_without_and_the_second_ask_reads_only_the_question(
    chat_dir,
    doc_file,
    tmp_path,
    recorded,
    read_tokens,
):
    """Without a session, with a new one and with the saved one: the same answer; the third
    reads the question and the answer only (not the document), and leaves the saved session
    as it was (the question is not kept, its blocks not written there)."""
    folder = tmp_path / "session"
    counts = []
    for extra in ([], ["--session", str(folder)], ["--session", str(folder)]):
        before = read_tokens[0]
        result = run_cli(cli_args(chat_dir, doc_file, *extra))
        assert result.exit_code == 0, result.output
        counts.append(read_tokens[0] - before)
        if len(counts) == 2:
            saved = {p.name: p.read_bytes() for p in folder.rglob("*.*")}
    assert recorded[0] == recorded[1] == recorded[2] and len(recorded[0]) == NEW
    info = json.loads((folder / "session.json").read_text())
    read = info["document"]["tokens"]
    assert info["tokens"] == read and info["kind"] == "document"
    assert counts[0] == counts[1] and counts[2] == counts[0] - read
    assert "not read again" in result.stderr
    # the session's files as they were: the question's blocks went to a store of their own
    assert {p.name: p.read_bytes() for p in folder.rglob("*.*")} == saved
    record = (folder / "blocks" / "layer0.bin").stat().st_size // info["blocks"]
    assert info["blocks"] > 10 and record == info["block_bytes"]  # no block past the saved


def test_a_session_refuses_another_base_preset_settings_or_document(
    chat_dir,
    doc_file,
    tmp_path,
):
    folder = tmp_path / "session"
    assert run_cli(cli_args(chat_dir, doc_file, "--session", str(folder))).exit_code == 0
    other = write_chat_model(tmp_path / "other-model", seed=1)
    result = run_cli(cli_args(other, doc_file, "--session", str(folder)))
    assert result.exit_code == EXIT_USAGE
    assert str(chat_dir) in result.stderr and str(other) in result.stderr
    sink_and_window = {k: v for k, v in SMALL.items() if k != "blocks"}  # a baseline's
    result = run_cli(cli_args(chat_dir, doc_file, "--session", str(folder), "--preset", "window",
                              settings=sink_and_window))  # fmt: skip
    assert result.exit_code == EXIT_USAGE
    assert "preset 'retrieval', not 'window'" in result.stderr
    restated = {**SMALL, "choice": "question"}  # the default, given: the same memory
    result = run_cli(cli_args(chat_dir, doc_file, "--session", str(folder), settings=restated))
    assert result.exit_code == 0 and "not read again" in result.stderr
    wider = {**SMALL, "window": 40}
    result = run_cli(cli_args(chat_dir, doc_file, "--session", str(folder), settings=wider))
    assert result.exit_code == EXIT_USAGE and "window=32 (now 40)" in result.stderr
    (tmp_path / "other.txt").write_text(TEXT, encoding="utf-8")
    result = run_cli(cli_args(chat_dir, tmp_path / "other.txt", "--session", str(folder)))
    assert result.exit_code == EXIT_USAGE and "holds another document" in result.stderr
    result = run_cli(["chat", "--base-model", str(chat_dir), "--session", str(folder),
                      *settings_args(SMALL)], input="hello\n")  # fmt: skip
    assert result.exit_code == EXIT_USAGE
    assert "holds a document read, not a chat" in result.stderr
    mine = tmp_path / "mine"
    (mine / "blocks").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine", encoding="utf-8")
    result = run_cli(cli_args(chat_dir, doc_file, "--session", str(mine)))
    assert result.exit_code == EXIT_USAGE
    assert "holds files a session does not write (notes.txt)" in result.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["blocks", "notes.txt"]


def _same_state(a, b):
    for name in sessions.TENSORS:
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert len(a.keys) == len(b.keys) and all(map(torch.equal, a.keys, b.keys))
    assert (a.question is None) == (b.question is None)
    assert a.question is None or torch.equal(a.question, b.question)
    assert a.store.count == b.store.count
    ids = torch.arange(a.store.count)
    for layer in a.store.layers:
        assert torch.equal(a.store.read(layer, ids), b.store.read(layer, ids))


def test_a_saved_memory_loads_as_it_was_in_a_full_chunk_of_keys_and_a_partial_one(
    chat_dir, tmp_path
):
    """A memory read in a temporary store and saved (its blocks copied into the session):
    every tensor, choosing key and stored block the same once loaded; the answers too."""
    reader = DocumentReader.from_base(chat_dir, **SMALL)
    reader.read(LONG)
    assert len(reader.state.keys) == 2 and reader.state.keys[0].shape[1] == 512
    state = reader.state
    reader.save(tmp_path / "s")
    assert (tmp_path / "s" / "keys-0.safetensors").is_file()
    assert not (tmp_path / "s" / "keys-1.safetensors").exists()  # the partial one: in state
    loaded = DocumentReader.from_base(chat_dir, session=tmp_path / "s", **SMALL)
    _same_state(state, loaded.state)
    assert loaded.answer_tokens(QUESTION, max_new_tokens=NEW) == reader.answer_tokens(
        QUESTION, max_new_tokens=NEW
    )


MESSAGES = ["hello, my name is ada.", "what is my name?", TEXT * 3, "and the letter?"]


def test_a_conversation_goes_on_across_restarts_as_if_uninterrupted(chat_dir, tmp_path):
    """Four turns in one Chat, and the same four each in a new Chat loaded from the session
    the one before saved: the same answers; the blocks left the window into the store."""
    options = dict(max_new_tokens=6)
    one = Chat.from_base(chat_dir, **SMALL)
    straight = [one.say_tokens(m, **options) for m in MESSAGES]
    folder, restarted = tmp_path / "talk", []
    for message in MESSAGES:
        chat = Chat.from_base(chat_dir, session=folder, **SMALL)
        restarted.append(chat.say_tokens(message, **options))  # saved to from_base's session
    assert restarted == straight
    assert chat.info.turns == 4 and int(chat.state.blocks[0]) > 10
    _same_state(one.state, sessions.load_session(folder, chat.model)[0])
    assert [p.name for p in folder.glob("state-*")] == ["state-4.safetensors"]


def test_the_chat_command_keeps_its_memory_across_runs(chat_dir, tmp_path, recorded):
    folder = tmp_path / "talk"
    args = ["chat", "--base-model", str(chat_dir), "--session", str(folder),
            "--max-new-tokens", "6", *settings_args(SMALL)]  # fmt: skip
    result = run_cli(args, input="\n".join(MESSAGES[:2]) + "\n")
    assert result.exit_code == 0, result.output
    result = run_cli(args, input="\n" + "\n".join(MESSAGES[2:]) + "\n")  # a blank line: skipped
    assert result.exit_code == 0, result.output
    assert "session" in result.stderr and "2 turns" in result.stderr
    chat = Chat.from_base(chat_dir, **SMALL)
    assert recorded == [chat.say_tokens(m, max_new_tokens=6) for m in MESSAGES]
    assert result.stdout.count("\n") == 2  # each answer on its line, no prompt (not a tty)


def test_a_conversation_opened_by_a_document(chat_dir, doc_file, tmp_path, recorded):
    """chat --document: the document is the start of the first message; the answers are the
    Python Chat's after `read`; a second --document on the same session is refused."""
    folder = tmp_path / "talk"
    args = ["chat", "--base-model", str(chat_dir), "--session", str(folder), "--document",
            str(doc_file), "--max-new-tokens", "6", *settings_args(SMALL)]  # fmt: skip
    messages = ["when did the letter come?", "who said it?"]
    result = run_cli(args, input="\n".join(messages) + "\n")
    assert result.exit_code == 0, result.output
    chat = Chat.from_base(chat_dir, **SMALL)
    chat.read(DOCUMENT)
    first = chat.turn_tokens("when did the letter come?")
    assert chat.tokenizer.decode(first).startswith("\n\nwhen did")  # the same message
    assert recorded == [chat.say_tokens(m, max_new_tokens=6) for m in messages]
    result = run_cli(args, input="again\n")
    assert result.exit_code == EXIT_USAGE and "holds a conversation already" in result.stderr


def test_a_long_conversations_save_writes_a_full_chunk_of_keys_once(chat_dir, tmp_path):
    """The choosing keys' full chunks are written once: later saves leave their file as it
    was, so a save costs the fixed-size state and the partial chunk."""
    folder = tmp_path / "talk"
    chat = Chat.from_base(chat_dir, **SMALL)
    chat.read(LONG, session=folder)
    chat.save(folder)
    chunk = folder / "keys-0.safetensors"
    stamp = chunk.stat().st_mtime_ns, chunk.stat().st_ino
    for message in MESSAGES:
        chat.say_tokens(message, session=folder, max_new_tokens=4)
    assert (chunk.stat().st_mtime_ns, chunk.stat().st_ino) == stamp
    assert json.loads((folder / "session.json").read_text())["key_chunks"] == 1


def test_a_save_that_fails_leaves_the_previous_one(chat_dir, tmp_path, monkeypatch):
    folder = tmp_path / "talk"
    chat = Chat.from_base(chat_dir, **SMALL)
    chat.say_tokens(MESSAGES[0], session=folder, max_new_tokens=4)
    before = sessions.load_session(folder, chat.model)[0]
    import safetensors.torch

    def full_disk(tensors, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        chat.say_tokens(MESSAGES[1], session=folder, max_new_tokens=4)
    monkeypatch.undo()
    again, info = sessions.load_session(folder, chat.model)
    _same_state(before, again)
    assert info.turns == 1 and sorted(p.name for p in folder.iterdir()) == [
        "blocks", "session.json", "state-1.safetensors"
    ]  # fmt: skip


def test_a_store_is_not_reopened_past_its_blocks(tmp_path):
    store = BlockStore([0, 1], heads=2, block=4, dim=8, folder=str(tmp_path), existing=True)
    store.append({layer: torch.zeros(3, 2, 2, 4, 8) for layer in (0, 1)})
    store.close()
    assert BlockStore.reopen([0, 1], 2, 4, 8, str(tmp_path), 3).count == 3
    with pytest.raises(ValueError, match="holds 3 blocks .* fewer than the 4"):
        BlockStore.reopen([0, 1], 2, 4, 8, str(tmp_path), 4)


def test_a_read_only_store_reads_the_saved_blocks_and_keeps_new_ones_apart(tmp_path):
    saved = BlockStore([0], heads=1, block=2, dim=2, folder=str(tmp_path), existing=True)
    old = torch.arange(3 * 8, dtype=torch.float16).view(3, 2, 1, 2, 2)
    saved.append({0: old})
    store = sessions.ReadOnlyStore(saved, 3)
    new = -torch.arange(2 * 8, dtype=torch.float16).view(2, 2, 1, 2, 2) - 1
    assert store.append({0: new}).tolist() == [3, 4] and store.count == 5
    got = store.read(0, torch.tensor([[4, 0], [1, 3]]))
    assert torch.equal(got, torch.stack([torch.stack([new[1], old[0]]),
                                         torch.stack([old[1], new[0]])]))  # fmt: skip
    keys = store.read(0, torch.tensor([[4, 0], [1, 3]]), keys_only=True)  # saved and new alike
    assert torch.equal(keys, got[:, :, 0])
    assert torch.equal(store.read(0, torch.tensor([1, 2]), keys_only=True), old[1:, 0])
    assert (tmp_path / "layer0.bin").stat().st_size == 3 * store.record  # not written
