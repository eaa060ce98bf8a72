"""Reader for CMU-DoG, the CMU Document Grounded Conversations (Zhou, Prabhumoye & Black, EMNLP
2018), in the compact form kept under ``shared/data/cmu-dog`` (see its README.md):

- ``docs.json``: ``{wikiDocumentIdx: {"file", "sections": {"0": {movieName, year, director, genre,
  cast[], introduction, rating[], critical_response[]}, "1": str, "2": str, "3": str}}}``, 30
  Wikipedia movie articles, each cut into four sections: section 0 the movie's facts and
  introduction, sections 1–3 the plot in order;
- ``{train,valid,test}.jsonl``: one conversation a line, ``{id, wikiDocumentIdx, rating (1–3),
  status, whoSawDoc[], turns: [{uid: "user1" | "user2", docIdx: 0–3, text}]}`` (3373 / 229 / 619
  conversations). ``docIdx`` is the section that was on the speakers' screen when the turn was
  written (the interface moved through the sections as the chat went on).

How the ∞-former used it (paper §4.3). CMU-DoG pairs each part of a dialogue with the section it
is about; the paper makes the task harder by giving the model the document only *before the
dialogue starts*: GPT-2 small is fine-tuned with a continuous long-term memory (N = 512 basis
functions) so that the whole document can stay in memory while the dialogue is generated turn by
turn with speaker tokens. The authors' released evaluation script agrees: each conversation is
one token sequence, the document (one ``Document:`` line of their pre-processed files, the whole
article) followed by the utterances, with speaker tokens assigned by alternation (so consecutive
turns of one speaker, 30% of the turn pairs here, break the alternation unless merged:
:func:`merge_consecutive_turns`); the sequence is cut into 512-token chunks, so the document
reaches the model through its memory, and replies are generated and scored from the fourth
utterance on (three utterances of history).
:func:`dialogue_examples` therefore gives the full document by default (``grounding="full"``)
and the section in view on request (``grounding="section"``, CMU-DoG's own setting).

Data quirks, kept as they are (the reader adds and removes nothing):

- 110 conversations occur, identical, in two splits: 63 in train and test, 45 in train and
  valid, 2 in valid and test (4111 distinct conversations of 4221). A task that wants a clean
  test set must drop them itself (compare ``conversation_id``).
- 17 training turns have blank text: they stay in histories but are never returned as replies.
- 155 test conversations store ``status`` as JSON ``false``: read as 0.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from .paths import SPLITS, check_split, resolve_data_dir

__all__ = [
    "DOCS_FILE",
    "NUM_SECTIONS",
    "SPEAKERS",
    "SPLITS",
    "Conversation",
    "DialogueExample",
    "MovieDocument",
    "Turn",
    "dialogue_examples",
    "load_cmu_dog",
    "load_documents",
    "merge_consecutive_turns",
    "resolve_cmu_dog_dir",
]

NUM_SECTIONS = 4
SPEAKERS = ("user1", "user2")
DOCS_FILE = "docs.json"
DIR_NAME = "cmu-dog"
Grounding = Literal["full", "section"]


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Turn:
    """One utterance: who wrote it, the document section on screen (0–3) and the text."""

    speaker: str
    section: int
    text: str

    def __post_init__(self) -> None:
        if self.speaker not in SPEAKERS:
            raise ValueError(f"speaker must be one of {SPEAKERS}, got {self.speaker!r}")
        if not _is_int(self.section) or not 0 <= self.section < NUM_SECTIONS:
            raise ValueError(
                f"section must be an int in 0..{NUM_SECTIONS - 1}, got {self.section!r}"
            )
        if not isinstance(self.text, str):
            raise TypeError(f"text must be a str, got {type(self.text).__name__}")


@dataclass(frozen=True)
class Conversation:
    """One chat about one movie document (``doc_id`` = CMU-DoG's ``wikiDocumentIdx``)."""

    conversation_id: str
    doc_id: int
    turns: tuple[Turn, ...]
    rating: int  # the workers' rating of the conversation, 1-3
    status: int
    who_saw_doc: tuple[str, ...]  # which of user1/user2 had the document (both in some)

    def __post_init__(self) -> None:
        if not isinstance(self.conversation_id, str) or not self.conversation_id:
            raise ValueError(
                f"conversation_id must be a non-empty str, got {self.conversation_id!r}"
            )
        if not _is_int(self.doc_id) or self.doc_id < 0:
            raise ValueError(f"doc_id must be an int >= 0, got {self.doc_id!r}")
        if not isinstance(self.turns, tuple) or not all(isinstance(t, Turn) for t in self.turns):
            raise TypeError("turns must be a tuple of Turn")
        if not _is_int(self.rating) or not _is_int(self.status):
            raise ValueError(
                f"rating and status must be ints, got {self.rating!r}, {self.status!r}"
            )
        if not isinstance(self.who_saw_doc, tuple) or not set(self.who_saw_doc) <= set(SPEAKERS):
            raise ValueError(f"who_saw_doc must be a tuple of {SPEAKERS}, got {self.who_saw_doc!r}")


@dataclass(frozen=True)
class MovieDocument:
    """One movie article in its four sections, section 0 rendered from the movie's facts.

    Section 0 is stored as fields in the data; ``sections[0]`` renders them as lines
    ``"<movie> (<year>)"``, ``"Director: ..."``, ``"Genre: ..."``, ``"Cast: ..."``,
    ``"Introduction: ..."``, ``"Rating: ..."`` (cast and ratings joined by ``"; "``) and
    ``'Critical response: "..." "..."'`` (each quote in double quotes), in the order the data
    lists them. Sections 1–3 are the plot, as given.
    """

    doc_id: int
    file: str
    movie_name: str
    year: str
    director: str
    genre: str
    cast: tuple[str, ...]
    introduction: str
    ratings: tuple[str, ...]
    critical_response: tuple[str, ...]
    sections: tuple[str, ...]  # NUM_SECTIONS strings

    def __post_init__(self) -> None:
        if len(self.sections) != NUM_SECTIONS or not all(isinstance(s, str) for s in self.sections):
            raise ValueError(f"sections must be {NUM_SECTIONS} strings, got {self.sections!r:.80}")

    def text(self, sections: tuple[int, ...] | None = None, separator: str = "\n\n") -> str:
        """The given sections (default all, in order) joined by `separator`."""
        indices = range(NUM_SECTIONS) if sections is None else sections
        for index in indices:
            if not _is_int(index) or not 0 <= index < NUM_SECTIONS:
                raise ValueError(f"section indices must be in 0..{NUM_SECTIONS - 1}, got {index!r}")
        return separator.join(self.sections[index] for index in indices)


@dataclass(frozen=True)
class DialogueExample:
    """Predict `reply` (``turns[reply_index]`` of the conversation) from `history` (every earlier
    turn, oldest first) grounded on `document` (all sections in order, or the one in view)."""

    conversation_id: str
    doc_id: int
    reply_index: int
    document: tuple[str, ...]
    history: tuple[Turn, ...]
    reply: Turn


# ---------------------------------------------------------------------------------------- files


def resolve_cmu_dog_dir(data_dir: str | Path | None = None) -> Path:
    """The CMU-DoG folder: `data_dir` itself if it holds docs.json, else ``data_dir/cmu-dog``
    (so both the folder and the shared data root are accepted; None: the default data
    directory). FileNotFoundError otherwise."""
    path = resolve_data_dir(data_dir)
    if (path / DOCS_FILE).is_file():
        return path
    nested = path / DIR_NAME
    if nested.is_dir():
        return nested
    raise FileNotFoundError(
        f"no CMU-DoG data in {path}: expected {path / DOCS_FILE} or a {DIR_NAME}/ folder"
    )


def _required_file(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise FileNotFoundError(f"CMU-DoG file not found: {path}")
    return path


def _get(record: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in record:
        raise ValueError(f"{where}: missing field {key!r}")
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise ValueError(f"{where}: field {key!r} must be {names}, got {type(value).__name__}")
    return value


def _str_list(record: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _get(record, key, list, where)
    if not all(isinstance(item, str) for item in items):
        raise ValueError(f"{where}: field {key!r} must be a list of str")
    return tuple(items)


def _render_facts(facts: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str]:
    fields = {
        "movie_name": _get(facts, "movieName", str, where).strip(),
        "year": _get(facts, "year", str, where).strip(),
        "director": _get(facts, "director", str, where).strip(),
        "genre": _get(facts, "genre", str, where).strip(),
        "cast": tuple(s.strip() for s in _str_list(facts, "cast", where)),
        "introduction": _get(facts, "introduction", str, where).strip(),
        "ratings": tuple(s.strip() for s in _str_list(facts, "rating", where)),
        "critical_response": tuple(s.strip() for s in _str_list(facts, "critical_response", where)),
    }
    lines = [
        f"{fields['movie_name']} ({fields['year']})",
        f"Director: {fields['director']}",
        f"Genre: {fields['genre']}",
        f"Cast: {'; '.join(fields['cast'])}",
        f"Introduction: {fields['introduction']}",
        f"Rating: {'; '.join(fields['ratings'])}",
        "Critical response: " + " ".join(f'"{quote}"' for quote in fields["critical_response"]),
    ]
    return fields, "\n".join(lines)


def load_documents(data_dir: str | Path | None = None) -> dict[int, MovieDocument]:
    """The movie documents of ``docs.json``, keyed by ``wikiDocumentIdx`` (ascending)."""
    path = _required_file(resolve_cmu_dog_dir(data_dir), DOCS_FILE)
    try:
        with _reading(path):
            text = path.read_text(encoding="utf-8")
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of documents, got {type(raw).__name__}")
    documents = {}
    for key, entry in raw.items():
        where = f"{path}: document {key!r}"
        if not key.isdigit():
            raise ValueError(f"{where}: keys must be document indices (digits)")
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: expected an object, got {type(entry).__name__}")
        sections = _get(entry, "sections", dict, where)
        expected = [str(i) for i in range(NUM_SECTIONS)]
        if sorted(sections) != expected:
            raise ValueError(f"{where}: sections must be {expected}, got {sorted(sections)}")
        facts, first = _render_facts(_get(sections, "0", dict, where), f"{where} section '0'")
        plot = tuple(_get(sections, str(i), str, where) for i in range(1, NUM_SECTIONS))
        doc_id = int(key)
        documents[doc_id] = MovieDocument(
            doc_id=doc_id,
            file=_get(entry, "file", str, where),
            sections=(first, *plot),
            **facts,
        )
    return dict(sorted(documents.items()))


def _parse_conversation(record: Any, where: str) -> Conversation:
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    raw_turns = _get(record, "turns", list, where)
    turns = []
    for index, raw in enumerate(raw_turns):
        turn_where = f"{where}: turns[{index}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{turn_where}: expected an object, got {type(raw).__name__}")
        try:
            turns.append(
                Turn(
                    speaker=_get(raw, "uid", str, turn_where),
                    section=_get(raw, "docIdx", int, turn_where),
                    text=_get(raw, "text", str, turn_where),
                )
            )
        except (TypeError, ValueError) as error:
            if str(error).startswith(turn_where):
                raise
            raise ValueError(f"{turn_where}: {error}") from None
    try:
        return Conversation(
            conversation_id=_get(record, "id", str, where),
            doc_id=_get(record, "wikiDocumentIdx", int, where),
            turns=tuple(turns),
            rating=_get(record, "rating", int, where),
            status=int(_get(record, "status", (int, bool), where)),  # test has `false` for 0
            who_saw_doc=_str_list(record, "whoSawDoc", where),
        )
    except (TypeError, ValueError) as error:
        if str(error).startswith(where):
            raise
        raise ValueError(f"{where}: {error}") from None


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[None]:
    """Errors while reading `path` name it: bytes that are not UTF-8 (a ValueError), and
    operating-system errors raised without a file name (e.g. EIO in the middle of a read)."""
    try:
        yield
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason})") from None
    except OSError as error:
        if error.filename is None:
            error.filename = str(path)
        raise


def load_cmu_dog(data_dir: str | Path | None, split: str) -> list[Conversation]:
    """The conversations of one split (``"train"``, ``"valid"`` or ``"test"``), in file order.

    `data_dir` is the CMU-DoG folder or the data root holding ``cmu-dog/``. Raises
    FileNotFoundError for a missing folder or file and ValueError naming ``file:line`` for a
    malformed line (blank lines are skipped).
    """
    check_split(split)
    path = _required_file(resolve_cmu_dog_dir(data_dir), f"{split}.jsonl")
    conversations = []
    with _reading(path), path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where}: not valid JSON ({error.msg})") from None
            conversations.append(_parse_conversation(record, where))
    return conversations


# ------------------------------------------------------------------------------------- examples


def merge_consecutive_turns(conversation: Conversation, separator: str = " ") -> Conversation:
    """The conversation with each run of consecutive turns by one speaker joined into one turn
    (texts joined by `separator`, empty texts dropped from the join; the section is the one on
    screen at the run's last turn), so that speakers strictly alternate."""
    if not isinstance(conversation, Conversation):
        raise TypeError(f"conversation must be a Conversation, got {type(conversation).__name__}")
    merged: list[Turn] = []
    for turn in conversation.turns:
        if merged and merged[-1].speaker == turn.speaker:
            previous = merged[-1]
            text = separator.join(t for t in (previous.text, turn.text) if t)
            merged[-1] = Turn(speaker=turn.speaker, section=turn.section, text=text)
        else:
            merged.append(turn)
    return replace(conversation, turns=tuple(merged))


def dialogue_examples(
    conversation: Conversation,
    documents: Mapping[int, MovieDocument],
    *,
    grounding: Grounding = "full",
    min_history: int = 1,
) -> list[DialogueExample]:
    """One example per turn that has at least `min_history` earlier turns (and non-blank text).

    ``grounding="full"``: the document is all four sections in order (what the ∞-former kept in
    long-term memory; module docstring). ``grounding="section"``: only the section on screen
    when the reply was written (``reply.section``). The authors scored replies with
    ``min_history=3``.
    """
    if not isinstance(conversation, Conversation):
        raise TypeError(f"conversation must be a Conversation, got {type(conversation).__name__}")
    if grounding not in ("full", "section"):
        raise ValueError(f"grounding must be 'full' or 'section', got {grounding!r}")
    if not _is_int(min_history) or min_history < 1:
        raise ValueError(f"min_history must be an int >= 1, got {min_history!r}")
    if conversation.doc_id not in documents:
        raise ValueError(
            f"conversation {conversation.conversation_id}: document {conversation.doc_id} is not "
            f"among the {len(documents)} documents given"
        )
    document = documents[conversation.doc_id]
    examples = []
    for index in range(min_history, len(conversation.turns)):
        reply = conversation.turns[index]
        if not reply.text.strip():
            continue
        grounded = document.sections if grounding == "full" else (document.sections[reply.section],)
        examples.append(
            DialogueExample(
                conversation_id=conversation.conversation_id,
                doc_id=conversation.doc_id,
                reply_index=index,
                document=grounded,
                history=conversation.turns[:index],
                reply=reply,
            )
        )
    return examples
