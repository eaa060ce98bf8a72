"""`inftyformer ask` and `inftyformer.retrieval.ask`: a document read into the retrieval memory,
a question templated after it, the answer streamed and stopped at the end-of-sequence tokens;
the command line and the Python API give the same tokens; with a window holding the whole
stream the answer is the base's own greedy continuation."""

import json

import pytest
import torch
from ask_models import (
    DOCUMENT,
    NEW,
    QUESTION,
    SMALL,
    TEXT,
    WHOLE,
    Recorder,
    cli_args,
    python_answer,
    run_cli,
    write_chat_model,
)

from inftyformer.commands import ask as ask_command
from inftyformer.errors import EXIT_USAGE
from inftyformer.retrieval.ask import DocumentReader
from inftyformer.retrieval.prompts import TurnFormat


def test_the_command_prints_the_python_apis_answer_as_it_streams(chat_dir, doc_file, recorded):
    """The CLI's answer is the Python API's, token for token, printed as text (the tokens put
    one at a time to a TextStreamer), the document's reading reported on stderr."""
    tokens, reader = python_answer(chat_dir)
    assert len(tokens) == NEW  # no stop token in this model's answers
    result = run_cli(cli_args(chat_dir, doc_file))
    assert result.exit_code == 0, result.output
    assert recorded == [tokens]
    assert result.stdout == reader.tokenizer.decode(tokens, skip_special_tokens=True) + "\n"
    assert f"read {len(reader.document_tokens(DOCUMENT)):,} tokens" in result.stderr


def test_the_python_streamer_gets_each_token_then_the_end(chat_dir):
    recorder = Recorder()
    tokens, _ = python_answer(chat_dir, streamer=recorder)
    assert recorder.tokens == tokens and recorder.ended == 1


def test_an_end_of_sequence_token_of_the_generation_config_stops_the_answer(
    chat_dir,
    doc_file,
    tmp_path,
    recorded,
):
    """generation_config.json's eos_token_id (a list) stops the answer before its token: the
    answer is the unstopped one up to it."""
    tokens, reader = python_answer(chat_dir)
    k = next(i for i in range(2, NEW) if tokens[i] not in tokens[:i])
    folder = tmp_path / "model"
    folder.mkdir()
    for path in chat_dir.iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(
        json.dumps({**config, "eos_token_id": [reader.tokenizer.eos_token_id, tokens[k]]})
    )
    result = run_cli(cli_args(folder, doc_file))
    assert result.exit_code == 0, result.output
    assert recorded == [tokens[:k]]
    stopped, _ = python_answer(folder)
    assert stopped == tokens[:k]


def test_the_tokenizers_end_of_sequence_token_stops_the_answer(chat_dir):
    """The tokenizer's eos (ChatML's <|im_end|>) made the likeliest token: no answer at all."""
    reader = DocumentReader.from_base(chat_dir, **SMALL)
    eos = reader.tokenizer.eos_token_id
    assert eos in reader.stop
    with torch.no_grad():
        reader.model.base.get_output_embeddings().weight[eos] = 1e3 * torch.ones(32)
        reader.model.base.model.norm.weight.abs_()  # hidden states of positive mean
    reader.read(DOCUMENT)
    assert reader.answer_tokens(QUESTION, max_new_tokens=NEW) == []


def test_standard_input_is_a_document(chat_dir, doc_file, recorded):
    assert run_cli(cli_args(chat_dir, doc_file)).exit_code == 0
    result = run_cli(cli_args(chat_dir, "-"), input=DOCUMENT)
    assert result.exit_code == 0, result.output
    assert "standard input: read" in result.stderr
    assert recorded[0] == recorded[1]


def test_a_folder_is_its_files_in_order_each_after_its_name(chat_dir, tmp_path, recorded):
    """b.txt and a.txt in a folder (a hidden file left out) are read as one text: a.txt's name
    and text, a blank line, b.txt's; the answer is that text's."""
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "b.txt").write_text(TEXT * 2, encoding="utf-8")
    (folder / "a.txt").write_text(TEXT * 3, encoding="utf-8")
    (folder / ".hidden").write_text("not this", encoding="utf-8")
    joined = f"a.txt\n{TEXT * 3}\n\nsub/b.txt\n{TEXT * 2}"
    assert ask_command.document_text(str(folder)) == (joined, f"2 files of {folder}")
    result = run_cli(cli_args(chat_dir, folder))
    assert result.exit_code == 0, result.output
    assert recorded == [python_answer(chat_dir, document=joined)[0]]


@pytest.mark.parametrize("chat", [True, False], ids=["template", "plain"])
def test_a_window_holding_the_stream_answers_as_the_bases_own_greedy_generate(
    chat_dir, tmp_path, chat
):
    """Everything read is the whole stream at its true distances: the answer's tokens are the
    base's greedy continuation of the same prompt (the templated document and question, or
    the plain one of a tokenizer without a template)."""
    from transformers import AutoModelForCausalLM

    document = TEXT * 2
    chat_dir = chat_dir if chat else write_chat_model(tmp_path / "plain", chat=False)
    tokens, reader = python_answer(chat_dir, document=document, settings=WHOLE)
    prompt = reader.document_tokens(document) + reader.question_tokens(QUESTION)
    assert len(prompt) + NEW < WHOLE["window"]
    text = reader.tokenizer.decode(prompt)
    if chat:
        assert text.startswith("<|im_start|>user\n" + document + "\n\n" + QUESTION)
        assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    else:
        assert text == document + "\n\nQuestion: " + QUESTION + "\nAnswer:"
    base = AutoModelForCausalLM.from_pretrained(str(chat_dir), dtype=torch.float32).eval()
    out = base.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False,
                        eos_token_id=sorted(reader.stop), pad_token_id=0)  # fmt: skip
    assert tokens == out[0, len(prompt) :].tolist()
    # the first answer token's logits are the base's; with a window of 32 (the rest in the
    # store, 2 blocks read) they are not
    with torch.no_grad():
        full = base(torch.tensor([prompt])).logits[0, -1]
        for settings, close in ((WHOLE, True), (SMALL, False)):
            model = DocumentReader.from_base(chat_dir, **settings).model
            logits = model(torch.tensor([prompt]), reselect=True, logits_to_keep=1).logits
            assert ((logits[0, -1] - full).abs().max() < 1e-4) == close


def test_the_turns_are_cut_from_the_chat_template_and_plain_without_one(chat_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_dir))
    f = TurnFormat.of(tokenizer)
    assert (f.start, f.after_user, f.between, f.templated) == (
        "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n",
        "<|im_end|>\n<|im_start|>user\n", True,
    )  # fmt: skip
    tokenizer.chat_template = None
    plain = TurnFormat.of(tokenizer).plain_document()
    assert (plain.start, plain.question, plain.after_user) == ("", "\n\nQuestion: ", "\nAnswer:")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    with pytest.raises(ValueError, match="changes or repeats a message's text"):
        TurnFormat.of(tokenizer)


def test_bad_input_is_named(chat_dir, doc_file, tmp_path):
    result = run_cli(cli_args(chat_dir, doc_file, question=" "))
    assert result.exit_code == EXIT_USAGE and "QUESTION is empty" in result.stderr
    result = run_cli(cli_args(chat_dir, tmp_path / "none.txt"))
    assert result.exit_code == EXIT_USAGE and "none.txt" in result.stderr
    result = run_cli(cli_args(chat_dir, doc_file, "--set", "window"))
    assert result.exit_code == EXIT_USAGE and "--set takes KEY=VALUE" in result.stderr
    result = run_cli(cli_args(chat_dir, doc_file, "--max-new-tokens", "0"))
    assert result.exit_code == EXIT_USAGE and "--max-new-tokens must be ≥ 1" in result.stderr
    (tmp_path / "empty").mkdir()
    result = run_cli(cli_args(chat_dir, tmp_path / "empty"))
    assert result.exit_code == EXIT_USAGE and "holds no files" in result.stderr
    # a bad preset or setting is named before a weight or the tokenizer is read: a folder of a
    # config alone gets the same answer as the whole model
    (tmp_path / "config-only").mkdir()
    (tmp_path / "config-only" / "config.json").write_text((chat_dir / "config.json").read_text())
    for folder in (chat_dir, tmp_path / "config-only"):
        result = run_cli(cli_args(folder, doc_file, "--preset", "retrieval-near"))
        assert result.exit_code == EXIT_USAGE, result.stderr
        assert "unknown retrieval preset 'retrieval-near'" in result.stderr
        result = run_cli(cli_args(folder, doc_file, "--set", "window=-1"))
        assert result.exit_code == EXIT_USAGE and "window" in result.stderr


def test_sampling_follows_its_seed(chat_dir, doc_file, recorded):
    """--temperature > 0 samples: the same seed, the same answer; another seed, another."""
    for seed in (3, 3, 4):
        args = cli_args(chat_dir, doc_file, "--temperature", "1.0", "--seed", str(seed))
        assert run_cli(args).exit_code == 0
    assert recorded[0] == recorded[1] != recorded[2]
    assert recorded[0] != python_answer(chat_dir)[0]  # not the greedy answer
