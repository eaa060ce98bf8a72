"""The Hugging Face tests need the optional extra (inftyformer[hf]); CI installs it."""

import pytest

pytest.importorskip("transformers")

from tiny_hf import ARCHITECTURES  # noqa: E402


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param


# the ask and session tests' model, document and the answers the command line printed
@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory):
    """A tiny chat model with its tokenizer and chat template, written to a folder."""
    from ask_models import write_chat_model

    return write_chat_model(tmp_path_factory.mktemp("chat-model"))


@pytest.fixture(scope="module")
def doc_file(tmp_path_factory):
    from ask_models import write_document

    return write_document(tmp_path_factory.mktemp("doc"))


@pytest.fixture
def recorded(monkeypatch):
    """The token ids each answer the command line printed (its streamer records them)."""
    from ask_models import record_streams

    return record_streams(monkeypatch)
