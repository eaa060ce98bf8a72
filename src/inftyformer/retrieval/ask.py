"""Ask a long document, keep a long conversation: a pretrained chat model with the retrieval
memory (`retrieval/model.py`) reads a document of any length once, then answers questions on it;
or talks for as long as one likes, its memory saved after every turn.

    from transformers import TextStreamer
    from inftyformer.retrieval.ask import Chat, DocumentReader

    reader = DocumentReader.from_base("models/smollm2-135m")   # preset "retrieval"
    reader.read(open("book.txt").read(), progress=True)   # into the memory, once
    reader.ask("Who wrote the letter?")                   # the answer's text
    reader.ask("And when?", streamer=TextStreamer(reader.tokenizer))   # printed as it comes
    reader.answer_tokens("And when?", max_new_tokens=64)  # the answer's token ids
    reader.save("book.session")                           # the memory of the book, on disk
    reader = DocumentReader.from_base("models/…", session="book.session")   # no re-reading

    chat = Chat.from_base("models/smollm2-135m", session="talk.session")
    chat.say("Hello, my name is Ada.")                    # saved to talk.session each turn

Every question is asked from the memory of the document alone (what one question and its
answer wrote is not kept for the next); a `Chat` keeps every turn. With a model built by hand,
``DocumentReader(RetrievalLM(base, preset=…), tokenizer)``. The text around the document, the
question and the turns is the tokenizer's chat template (`retrieval/prompts.py`); answers are
greedy unless `temperature` > 0 and stop at the end-of-sequence tokens (`prompts.stop_tokens`).
Reading never keeps a stream's logits (the last token's only). The guide: docs/ask.md.

Why these classes and not methods of `RetrievalLM`: the model knows token ids and states; a
reader also holds a tokenizer, its chat template's pieces, the stop tokens, one memory and
where it is saved, which are the user's objects, not the model's.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from . import session as sessions
from .config import RetrievalConfig
from .model import RetrievalLM
from .prompts import TurnFormat, begin_tokens, encode, stop_tokens
from .session import ModelKey, SessionInfo
from .state import RetrievalState

DEFAULT_PRESET = "retrieval"
DEFAULT_NEW_TOKENS = 256


def load_model(
    base_dir: str | Path, preset: str | None = DEFAULT_PRESET, device: str = "cpu", **settings
) -> tuple[RetrievalLM, Any, ModelKey]:
    """(model, tokenizer, key): the base in `base_dir` (a Hugging Face folder with its
    tokenizer) with the retrieval memory of `preset` and `settings` on top; the key records
    both for a session (`session.ModelKey`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(base_dir).expanduser()
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--base-model {folder} holds no config.json: not a model folder")
    # the preset and settings refused, if they are bad, before any weight is read
    config = RetrievalConfig.of(preset, **settings)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    base = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    model = RetrievalLM(base.to(device), config).eval()
    return model, tokenizer, ModelKey.of(folder, preset, settings, model.config)


@torch.no_grad()
def read(
    model: RetrievalLM,
    ids: list[int] | torch.Tensor,
    state: RetrievalState | None = None,
    *,
    progress: bool = False,
    desc: str = "reading",
) -> RetrievalState:
    """The state after reading the tokens `ids` (a stream's next tokens) in calls of
    segment_len, each keeping one token's logits; `progress`: a bar of tokens and the time
    left on stderr."""
    from .._progress import progress as bar

    ids = _row(ids, model)
    n, L = ids.shape[1], model.config.segment_len
    if state is None:
        state = model.init_state(1)
    with bar(total=n, desc=desc, unit=" tokens", unit_scale=True, enabled=progress) as shown:
        for start in range(0, n, L):  # as `model(ids)` streams them
            state = model(ids[:, start : start + L], state, logits_to_keep=1).state
            shown.update(min(L, n - start))
    return state


@torch.no_grad()
def answer(
    model: RetrievalLM,
    prompt: list[int] | torch.Tensor,
    state: RetrievalState,
    *,
    stop: set[int],
    max_new_tokens: int = DEFAULT_NEW_TOKENS,
    temperature: float = 0.0,
    generator: torch.Generator | None = None,
    streamer: Any = None,
    keep_last: bool = False,
) -> tuple[list[int], RetrievalState]:
    """(tokens, state): the answer to `prompt` (read with `reselect`: its last call chooses the
    blocks first) until a token of `stop` (not part of the answer, not read) or
    `max_new_tokens`; each token goes to `streamer.put` as it comes, then `streamer.end()`.
    `keep_last`: the state has also read the answer's last token (a conversation goes on
    from it); otherwise it has read all but that one."""
    check_answer_options(max_new_tokens, temperature)
    out = model(_row(prompt, model), state, reselect=True, logits_to_keep=1)
    logits, state = out.logits[:, -1], out.state
    hold = model.config.answer_choice == "question"
    new: list[int] = []
    while len(new) < max_new_tokens:
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, -1)
            token = torch.multinomial(probs, 1, generator=generator)  # [1, 1]
        else:
            token = logits.argmax(-1, keepdim=True)
        if int(token) in stop:
            break
        new.append(int(token))
        if streamer is not None:
            streamer.put(token[0].cpu())
        if len(new) == max_new_tokens and not keep_last:
            break
        out = model(token, state, keep_choice=hold, logits_to_keep=1)
        logits, state = out.logits[:, -1], out.state
    if streamer is not None:
        streamer.end()
    return new, state


def check_answer_options(
    max_new_tokens: int = DEFAULT_NEW_TOKENS, temperature: float = 0.0
) -> None:
    """`answer`'s max_new_tokens (an int ≥ 1) and temperature (≥ 0), refused by name; for a
    caller that checks them before reading a long document."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be ≥ 1, got {max_new_tokens}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")


def _row(ids: list[int] | torch.Tensor, model: RetrievalLM) -> torch.Tensor:
    """Token ids as one row [1, T] on the model's device."""
    if not isinstance(ids, torch.Tensor):
        ids = torch.tensor(list(ids), dtype=torch.long)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.shape[0] != 1:
        raise ValueError(f"token ids must be one row [T] or [1, T], got {tuple(ids.shape)}")
    if ids.shape[1] == 0:
        raise ValueError("no tokens to read")
    return ids.to(model._param().device)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _about(document: str, ids: list[int]) -> dict[str, Any]:
    """What a session records of a document: its text's sha256 and the tokens read of it."""
    return {"sha256": text_hash(document), "tokens": len(ids)}


class _Talk:
    """What a document reader and a conversation share: the model, its tokenizer, the turn
    format, the stop tokens, the memory (`state`) and what it was built with (`key`)."""

    kind = ""

    def __init__(self, model: RetrievalLM, tokenizer: Any, key: ModelKey | None = None) -> None:
        if not isinstance(model, RetrievalLM):
            raise TypeError(f"model must be a RetrievalLM, got {type(model).__name__}")
        self.model, self.tokenizer = model, tokenizer
        self.key = key or ModelKey.of(None, None, {}, model.config)
        self.format = TurnFormat.of(tokenizer)
        self.stop = stop_tokens(tokenizer, model.base)
        self.state: RetrievalState | None = None
        self.info = SessionInfo(self.kind, self.key)
        self.session: Path | None = None  # the folder the memory is saved to (`from_base`)

    @classmethod
    def from_base(
        cls,
        base_dir: str | Path,
        preset: str | None = DEFAULT_PRESET,
        *,
        session: str | Path | None = None,
        device: str = "cpu",
        **settings,
    ):
        """The base in `base_dir` with the memory of `preset` and `settings`; `session`: the
        folder the memory is kept in, loaded when it holds one (refused when read with another
        base, preset or settings), saved to by `read` and `say`."""
        model, tokenizer, key = load_model(base_dir, preset, device, **settings)
        talk = cls(model, tokenizer, key)
        if session is not None:
            talk.session = Path(session)
            if sessions.is_session(session):
                talk.load(session)
        return talk

    def load(self, folder: str | Path) -> None:
        """The memory saved in `folder` (`session.load_session`)."""
        read_only = self.kind == "document"  # questions never change a document's session
        state, info = sessions.load_session(folder, self.model, self.key, read_only)
        if info.kind != self.kind:
            what = "a document read" if info.kind == "document" else "a conversation"
            raise ValueError(f"session {folder} holds {what}, not a {self.kind}")
        self.state, self.info = state, replace(info, key=self.key)

    def save(self, folder: str | Path) -> None:
        """The memory to `folder` (`session.save_session`)."""
        if self.state is None:
            raise ValueError("nothing read yet: nothing to save")
        self.state = sessions.save_session(folder, self.state, self.info)

    def _new_state(self, folder: str | Path | None) -> RetrievalState:
        """An empty memory; its blocks in the session `folder` (emptied) when given."""
        state = self.model.init_state(1)
        if folder is None:
            return state
        state.store.close()
        sessions.clear(folder)
        from .store import BlockStore

        m, B = self.model, self.model.config.block_size
        store = BlockStore.reopen(m.retrieving, m.kv_heads, B, m.head_dim,
                                  sessions.blocks_folder(folder), 0, state.store.dtype)  # fmt: skip
        return replace(state, store=store)

    def _decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


class DocumentReader(_Talk):
    """Read a document once, ask it any number of questions (module doc)."""

    kind = "document"

    def __init__(self, model: RetrievalLM, tokenizer: Any, key: ModelKey | None = None) -> None:
        super().__init__(model, tokenizer, key)
        self.format = self.format.plain_document()

    def document_tokens(self, document: str) -> list[int]:
        """What is read of `document`: the opening of the user turn, then its text."""
        return begin_tokens(self.tokenizer, self.format) + encode(
            self.tokenizer, self.format.start + document
        )

    def read(
        self, document: str, *, progress: bool = False, session: str | Path | None = None
    ) -> RetrievalState:
        """Read `document` (text) into a new memory; `session` (default: `from_base`'s): a
        folder it is saved to, replacing what it held (its blocks written there as they leave
        the window)."""
        if not isinstance(document, str):
            raise TypeError(f"document must be text, got {type(document).__name__}")
        session = self.session if session is None else session
        ids = self.document_tokens(document)
        state = read(self.model, ids, self._new_state(session), progress=progress,
                     desc="reading the document")  # fmt: skip
        self.state = state
        self.info = SessionInfo("document", self.key, tokens=int(state.tokens[0]),
                                document=_about(document, ids))  # fmt: skip
        if session is not None:  # saved; the questions' blocks go to a store of their own
            self.save(session)
            store = sessions.ReadOnlyStore(self.state.store, self.state.store.count)
            self.state = replace(self.state, store=store)
        return self.state

    def holds(self, document: str) -> bool:
        """Whether the memory is of `document`."""
        return bool(self.info.document) and self.info.document["sha256"] == text_hash(document)

    def question_tokens(self, question: str) -> list[int]:
        f = self.format
        return encode(self.tokenizer, f.question + question + f.after_user)

    def answer_tokens(self, question: str, **options) -> list[int]:
        """The answer's tokens (`answer`'s options: max_new_tokens, temperature, generator,
        streamer), from the memory of the document alone."""
        if self.state is None:
            raise ValueError("read a document first (DocumentReader.read)")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be some text, got {question!r}")
        tokens, _ = answer(self.model, self.question_tokens(question), self.state,
                           stop=self.stop, **options)  # fmt: skip
        return tokens

    def ask(self, question: str, **options) -> str:
        """The answer's text (`answer_tokens`)."""
        return self._decode(self.answer_tokens(question, **options))


class Chat(_Talk):
    """A conversation whose memory keeps every turn (module doc); `document` opens it."""

    kind = "chat"

    def read(
        self, document: str, *, progress: bool = False, session: str | Path | None = None
    ) -> RetrievalState:
        """Open the conversation with `document`: the start of the first user message (the
        message follows it after a blank line); `session` (default: `from_base`'s): the folder
        it is saved to."""
        session = self.session if session is None else session
        if self.state is not None:
            raise ValueError("a document opens a conversation: this one has begun")
        ids = begin_tokens(self.tokenizer, self.format) + encode(
            self.tokenizer, self.format.start + document
        )
        self.state = read(self.model, ids, self._new_state(session), progress=progress,
                          desc="reading the document")  # fmt: skip
        self.info = replace(self.info, tokens=int(self.state.tokens[0]), opens="document",
                            document=_about(document, ids))  # fmt: skip
        if session is not None:
            self.save(session)
        return self.state

    def turn_tokens(self, message: str) -> list[int]:
        """What is read of a user message: the text that opens it (the conversation's start,
        the end of the last answer, or the blank line after a document), the message, the
        opening of the answer."""
        f, opens = self.format, self.info.opens
        before = {"start": f.start, "between": f.between, "document": f.question}[opens]
        begin = begin_tokens(self.tokenizer, f) if opens == "start" else []
        return begin + encode(self.tokenizer, before + message + f.after_user)

    def say(self, message: str, *, session: str | Path | None = None, **options) -> str:
        """The answer to `message` (`answer`'s options); the memory keeps the turn, saved to
        `session` (default: `from_base`'s) when there is one."""
        return self._decode(self.say_tokens(message, session=session, **options))

    def say_tokens(self, message: str, *, session: str | Path | None = None, **options):
        if not isinstance(message, str) or not message.strip():
            raise ValueError(f"message must be some text, got {message!r}")
        session = self.session if session is None else session
        if self.state is None:
            self.state = self._new_state(session)
        tokens, state = answer(self.model, self.turn_tokens(message), self.state,
                               stop=self.stop, keep_last=True, **options)  # fmt: skip
        self.state = state
        self.info = replace(self.info, tokens=int(state.tokens[0]),
                            opens="between", turns=self.info.turns + 1)  # fmt: skip
        if session is not None:
            self.save(session)
        return tokens


__all__ = ["Chat", "DocumentReader", "answer", "check_answer_options", "load_model", "read"]
