"""CMU-DoG reader: the real files (skipped when the shared data is absent) and small files made
here for every error path."""

import json
from pathlib import Path

import pytest

from inftyformer.data.cmu_dog import (
    NUM_SECTIONS,
    SPLITS,
    Conversation,
    Turn,
    dialogue_examples,
    load_cmu_dog,
    load_documents,
    merge_consecutive_turns,
    resolve_cmu_dog_dir,
)

FIRST_TRAIN_ID = "000dcd312b337a413d9b030846c5ea6cabbded9e"  # line 1 of train.jsonl


@pytest.fixture(scope="module")
def cmu_dog_dir(shared_data) -> Path:
    return shared_data / "cmu-dog"


@pytest.fixture(scope="module")
def splits(cmu_dog_dir):
    return {split: load_cmu_dog(cmu_dog_dir, split) for split in SPLITS}


@pytest.fixture(scope="module")
def documents(cmu_dog_dir):
    return load_documents(cmu_dog_dir)


# ------------------------------------------------------------------------------ the real data


def test_counts_match_the_readme(splits):
    assert {split: len(conversations) for split, conversations in splits.items()} == {
        "train": 3373,
        "valid": 229,
        "test": 619,
    }
    for conversations in splits.values():  # ids are unique within a split ...
        assert len({c.conversation_id for c in conversations}) == len(conversations)


def test_conversations_shared_between_splits(splits):
    # ... but 110 conversations occur in two splits, identical: 63 in train and test, 45 in
    # train and valid, 2 in valid and test (4111 distinct of 4221)
    seen = {}
    shared = {}
    for split, conversations in splits.items():
        for conversation in conversations:
            first = seen.setdefault(conversation.conversation_id, (split, conversation))
            if first[0] != split:
                assert conversation == first[1]
                shared[conversation.conversation_id] = (first[0], split)
    assert len(seen) == 4111
    pairs = sorted(shared.values())
    assert {pair: pairs.count(pair) for pair in set(pairs)} == {
        ("train", "test"): 63,
        ("train", "valid"): 45,
        ("valid", "test"): 2,
    }


def test_sections_speakers_and_documents(splits, documents):
    assert sorted(documents) == list(range(30))
    for document in documents.values():
        assert len(document.sections) == NUM_SECTIONS and all(s.strip() for s in document.sections)
    for conversations in splits.values():
        assert {t.section for c in conversations for t in c.turns} == {0, 1, 2, 3}
        assert {t.speaker for c in conversations for t in c.turns} == {"user1", "user2"}
        # the splits are by conversation: every document occurs in every split (README)
        assert {c.doc_id for c in conversations} == set(documents)


def test_hand_checked_conversation(splits, documents):
    conversation = splits["train"][0]
    assert conversation.conversation_id == FIRST_TRAIN_ID
    assert (conversation.doc_id, conversation.rating, conversation.status) == (17, 2, 1)
    assert conversation.who_saw_doc == ("user2",)
    assert len(conversation.turns) == 29
    assert conversation.turns[0] == Turn("user1", 0, "hello")
    # the first turn on section 1 (the plot's first part)
    assert conversation.turns[9] == Turn(
        "user1",
        1,
        "Yes I think it could be, although I personally do not like facebook as a company.",
    )

    document = documents[17]
    assert (document.movie_name, document.year, document.file) == (
        "The Social Network",
        "2010",
        "The_Social_Network.json",
    )
    assert document.sections[0].startswith(
        "The Social Network (2010)\nDirector: David Fincher\nGenre: Biographical, drama\n"
        "Cast: Jesse Eisenberg as Mark Zuckerberg; Andrew Garfield as Eduardo Saverin;"
    )
    assert document.text() == "\n\n".join(document.sections)
    assert document.text((1,)) == document.sections[1]

    examples = dialogue_examples(conversation, documents)
    assert len(examples) == 28  # every turn but the first; no turn here is empty
    example = examples[8]
    assert (example.reply_index, example.reply) == (9, conversation.turns[9])
    assert example.history == conversation.turns[:9]
    assert example.history[-1] == Turn("user2", 0, "may be worth watching!")
    assert example.document == document.sections  # all four, in order
    in_view = dialogue_examples(conversation, documents, grounding="section")[8]
    assert in_view.document == (document.sections[1],)  # the section of the reply
    # the authors' setting: three turns of history before the first reply
    assert [e.reply_index for e in dialogue_examples(conversation, documents, min_history=3)] == (
        list(range(3, 29))
    )


def test_merging_makes_speakers_alternate(splits):
    conversation = merge_consecutive_turns(splits["train"][0])
    assert len(conversation.turns) == 25
    # turns 7 and 8 (both user2, section 0) become one
    assert conversation.turns[7] == Turn(
        "user2",
        0,
        "Rotten Tomatoes has rated it 96% so that's decent, and it is a movie from 2010 "
        "may be worth watching!",
    )
    for c in splits["test"]:
        speakers = [t.speaker for t in merge_consecutive_turns(c).turns]
        assert all(a != b for a, b in zip(speakers, speakers[1:], strict=False))


def test_data_quirks(splits, documents):
    # 155 test conversations store status as JSON false: read as 0
    assert splits["test"][1].conversation_id == "00b9693c240d4a200b23b0e5424fe0b7767a40bd"
    assert splits["test"][1].status == 0
    assert sum(c.status == 0 for c in splits["test"]) == 155
    # 17 blank training turns: kept in the conversation, never returned as a reply
    train = splits["train"]
    assert sum(not t.text.strip() for c in train for t in c.turns) == 17
    conversation = train[752]  # its turn 8 is a single space
    assert conversation.turns[8].text == " "
    replies = [e.reply_index for e in dialogue_examples(conversation, documents)]
    assert 8 not in replies and 9 in replies


# ------------------------------------------------------------------------ small files, errors


def _turn(uid="user1", doc_idx=0, text="hi"):
    return {"uid": uid, "docIdx": doc_idx, "text": text}


def _conversation(**overrides):
    record = {
        "id": "c1",
        "wikiDocumentIdx": 0,
        "rating": 2,
        "status": 1,
        "whoSawDoc": ["user1"],
        "turns": [_turn(), _turn("user2", 0, "hello"), _turn("user1", 2, "about the plot")],
    }
    record.update(overrides)
    return record


def _document():
    facts = {
        "movieName": "M",
        "year": "2000",
        "director": "D",
        "genre": "G",
        "cast": ["A as B ", "C as D"],
        "introduction": "Intro.",
        "rating": ["R: 1/10"],
        "critical_response": ["Good.", "Bad."],
    }
    return {"file": "M.json", "sections": {"0": facts, "1": "one", "2": "two", "3": "three"}}


def _write(folder: Path, lines=None, docs=None, split="train") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "docs.json").write_text(json.dumps(docs if docs is not None else {"0": _document()}))
    if lines is None:
        lines = [json.dumps(_conversation())]
    (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_small_files_round_trip(tmp_path):
    root = tmp_path / "data"
    folder = _write(root / "cmu-dog", lines=["", json.dumps(_conversation()), "  "])
    # the folder itself or the data root holding cmu-dog/
    assert resolve_cmu_dog_dir(root) == folder == resolve_cmu_dog_dir(folder)
    (conversation,) = load_cmu_dog(root, "train")  # blank lines skipped
    assert conversation == Conversation(
        conversation_id="c1",
        doc_id=0,
        turns=(
            Turn("user1", 0, "hi"),
            Turn("user2", 0, "hello"),
            Turn("user1", 2, "about the plot"),
        ),
        rating=2,
        status=1,
        who_saw_doc=("user1",),
    )
    document = load_documents(folder)[0]
    assert document.sections == (
        "M (2000)\nDirector: D\nGenre: G\nCast: A as B; C as D\nIntroduction: Intro.\n"
        'Rating: R: 1/10\nCritical response: "Good." "Bad."',
        "one",
        "two",
        "three",
    )
    assert document.cast == ("A as B", "C as D")
    examples = dialogue_examples(conversation, {0: document}, grounding="section")
    # the reply's section: turn 1 was written on section 0, turn 2 on section 2
    assert [(e.reply_index, e.document) for e in examples] == [
        (1, (document.sections[0],)),
        (2, ("two",)),
    ]
    assert load_cmu_dog(root, "train")[0].status == 1
    false_status = _write(tmp_path / "f", lines=[json.dumps(_conversation(status=False))])
    assert load_cmu_dog(false_status, "train")[0].status == 0


def test_missing_folder_and_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found: .*nowhere"):
        load_cmu_dog(tmp_path / "nowhere", "train")
    with pytest.raises(FileNotFoundError, match="no CMU-DoG data in"):
        load_documents(tmp_path)
    folder = _write(tmp_path / "cmu-dog")
    with pytest.raises(FileNotFoundError, match=r"file not found: .*valid\.jsonl"):
        load_cmu_dog(folder, "valid")
    with pytest.raises(ValueError, match="split must be one of"):
        load_cmu_dog(folder, "dev")
    with pytest.raises(TypeError, match="data_dir must be a str"):
        load_cmu_dog(3, "train")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object, got list"),
        (json.dumps(_conversation(turns="x")), "field 'turns' must be list"),
        (json.dumps({k: v for k, v in _conversation().items() if k != "id"}), "missing field 'id'"),
        (json.dumps(_conversation(wikiDocumentIdx="0")), "'wikiDocumentIdx' must be int, got str"),
        (json.dumps(_conversation(rating=True)), "'rating' must be int, got bool"),
        (json.dumps(_conversation(turns=[_turn(doc_idx=4)])), r"turns\[0\]: section must be"),
        (json.dumps(_conversation(turns=[_turn(), _turn("user3")])), r"turns\[1\]: speaker must"),
        (json.dumps(_conversation(turns=[_turn(text=None)])), r"turns\[0\]: field 'text' must"),
        (json.dumps(_conversation(whoSawDoc=["bob"])), "who_saw_doc must be"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, line, message):
    folder = _write(tmp_path, lines=[json.dumps(_conversation()), line])
    with pytest.raises(ValueError, match=message) as caught:
        load_cmu_dog(folder, "train")
    assert f"{folder / 'train.jsonl'}:2: " in str(caught.value)


def test_malformed_documents(tmp_path):
    broken = _document()
    del broken["sections"]["3"]
    with pytest.raises(ValueError, match=r"document '0': sections must be \['0', '1', '2', '3'\]"):
        load_documents(_write(tmp_path / "a", docs={"0": broken}))
    broken = _document()
    broken["sections"]["0"]["cast"] = "A"
    with pytest.raises(ValueError, match=r"section '0': field 'cast' must be list"):
        load_documents(_write(tmp_path / "b", docs={"0": broken}))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "docs.json").write_text("{")
    with pytest.raises(ValueError, match=r"docs\.json: not valid JSON"):
        load_documents(tmp_path / "c")


def test_example_arguments_are_checked(tmp_path):
    folder = _write(tmp_path)
    (conversation,) = load_cmu_dog(folder, "train")
    documents = load_documents(folder)
    with pytest.raises(ValueError, match="grounding must be"):
        dialogue_examples(conversation, documents, grounding="page")
    with pytest.raises(ValueError, match="min_history must be an int >= 1"):
        dialogue_examples(conversation, documents, min_history=0)
    with pytest.raises(ValueError, match="document 0 is not among the 0 documents"):
        dialogue_examples(conversation, {})
    with pytest.raises(TypeError, match="conversation must be a Conversation"):
        dialogue_examples({"turns": []}, documents)
    assert dialogue_examples(conversation, documents, min_history=3) == []


def test_read_errors_name_the_file(tmp_path, monkeypatch):
    import errno

    folder = _write(tmp_path / "a")
    with open(folder / "train.jsonl", "ab") as f:
        f.write(b'{"id": "caf\xe9"}\n')  # Latin-1, not UTF-8
    with pytest.raises(ValueError, match=r"train\.jsonl: not UTF-8 text"):
        load_cmu_dog(folder, "train")
    (folder / "docs.json").write_bytes(b'{"0": "\xff"}')
    with pytest.raises(ValueError, match=r"docs\.json: not UTF-8 text"):
        load_documents(folder)

    class Failing:  # a read failing half-way (EIO), as from a bad disk: raised without a name
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def __iter__(self):
            raise OSError(errno.EIO, "Input/output error")

    folder = _write(tmp_path / "b")
    monkeypatch.setattr(Path, "open", lambda self, *a, **k: Failing())
    with pytest.raises(OSError) as caught:
        load_cmu_dog(folder, "train")
    assert caught.value.filename == str(folder / "train.jsonl")
