"""lm_eval's model "inftyformer-retrieval" (`inftyformer.integrations.ruler_lm`): its
generate_until writes
what `RetrievalLM.generate` writes on the same prompt, past the base's positions, in batches or
alone; it stops at a stop string or the end-of-sequence token; bad model_args are refused by
name before any weight is read.

Needs the extra `inftyformer[eval]` (lm-eval 0.4.x); CI installs it."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.registry import get_model  # noqa: E402
from tiny_pretrained import write_tiny_model  # noqa: E402

from inftyformer.integrations.ruler_lm import (  # noqa: E402
    NAME,
    RetrievalHarnessLM,
    cut_at_stops,
    generation_settings,
    pick_device,
)

POSITIONS = 64  # the base's; every prompt is longer
# blocks of 4, 2 of them read, a sink block and a window of 8: context 23 positions, so that
# the prompts below are streamed and blocks are chosen among many
SMALL = "block_size=4,blocks=2,sink_blocks=1,window=8,segment_len=8"
TEXT = "the memory of a long book, said the signal, reads the past it needs and no more. "


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny random Llama whose blocks' weights are scaled up (x3), so that what it writes
    depends on what it reads (at the usual scale a random model writes the same tokens after
    most contexts: a test of what is read could not fail)."""
    from transformers import AutoModelForCausalLM

    path = write_tiny_model(tmp_path_factory.mktemp("tiny"), max_positions=POSITIONS)
    base = AutoModelForCausalLM.from_pretrained(str(path))
    with torch.no_grad():
        for name, weight in base.named_parameters():
            if ".self_attn." in name or ".mlp." in name:
                weight.mul_(3.0)
    base.save_pretrained(str(path))
    return path


def harness_lm(folder, extra: str = "") -> RetrievalHarnessLM:
    torch.set_num_threads(1)
    args = f"pretrained={folder},preset=retrieval,{SMALL}{extra}"
    return get_model(NAME).create_from_arg_string(args, {"batch_size": None, "device": "cpu"})


def request(text: str, **gen_kwargs) -> SimpleNamespace:
    return SimpleNamespace(args=(text, {"until": [], "do_sample": False, **gen_kwargs}))


def reference(lm: RetrievalHarnessLM, text: str, count: int) -> list[int]:
    ids = torch.tensor([lm.encode(text)])
    new, state = lm.model.generate(ids, count, temperature=0)
    state.store.close()
    return new[0].tolist()


def test_the_name_is_registered_with_lm_eval_beside_its_own_models():
    assert get_model(NAME) is RetrievalHarnessLM
    assert get_model("hf").__name__ == "HFLM"  # lm_eval fills only an empty registry


def test_generate_until_writes_what_generate_writes_past_the_base_positions(folder):
    lm = harness_lm(folder)
    prompt = TEXT * 6
    assert len(lm.encode(prompt)) > 2 * POSITIONS
    written = reference(lm, prompt, 12)
    (text,) = lm.generate_until([request(prompt, max_gen_toks=12)])
    assert text == lm.tokenizer.decode(written)
    assert len(set(written)) > 1  # a continuation that tells prompts apart


def test_prompts_of_one_length_go_together_and_write_what_each_writes_alone(folder):
    prompts = [TEXT * 5, (TEXT * 5).replace("memory", "signal"), TEXT * 4]
    alone = harness_lm(folder)
    one = alone.generate_until([request(p, max_gen_toks=8) for p in prompts])
    batched = harness_lm(folder, ",batch_size=3")
    calls = []
    forward = batched.model.forward
    batched.model.forward = lambda ids, *a, **k: calls.append(ids.shape[0]) or forward(ids, *a, **k)
    both = batched.generate_until([request(p, max_gen_toks=8) for p in prompts])
    assert both == one
    assert one == [alone.tokenizer.decode(reference(alone, p, 8)) for p in prompts]
    assert 2 in calls  # the two prompts of one token length read in one batch
    assert len(alone.encode(prompts[0])) == len(alone.encode(prompts[1]))


def test_generation_stops_at_a_stop_string_and_cuts_it_off(folder):
    lm = harness_lm(folder)
    prompt = TEXT * 6
    tokens = reference(lm, prompt, 16)
    full = lm.tokenizer.decode(tokens)
    # a later token's text, letters (a random byte-level model also writes partial characters)
    piece = lambda i: lm.tokenizer.decode(tokens[i : i + 1]).strip()  # noqa: E731
    k = next(i for i in range(3, 16) if piece(i).isascii() and piece(i).isalnum())
    stop = piece(k)
    first = next(i for i in range(1, 17) if stop in lm.tokenizer.decode(tokens[:i]))
    calls = []
    forward = lm.model.forward
    lm.model.forward = lambda ids, *a, **kw: calls.append(ids.shape[1]) or forward(ids, *a, **kw)
    (text,) = lm.generate_until([request(prompt, until=[stop], max_gen_toks=16)])
    assert text == full.split(stop, 1)[0]
    assert calls[0] == len(lm.encode(prompt))  # the prompt in one forward (streamed inside)
    assert len(calls) - 1 == first - 1  # then one call per token written after the first
    assert first <= k + 1 < 16


def test_generation_stops_at_the_end_of_sequence_token(folder):
    lm = harness_lm(folder)
    prompt = TEXT * 6
    tokens = reference(lm, prompt, 10)
    lm.eos_id = tokens[4]
    first = tokens.index(tokens[4])
    (text,) = lm.generate_until([request(prompt, max_gen_toks=10)])
    assert text == lm.tokenizer.decode(tokens[:first])


@pytest.mark.parametrize(
    "extra, message",
    [
        (",colour=3", "unknown model_args colour"),
        (",preset=salient-places", "unknown retrieval preset 'salient-places'"),
        (",window=-1", "window"),
        (",batch_size=0", "batch_size must be a positive int"),
        (",batch_size=auto", "batch_size must be a positive int"),
        (",batch_size=2.5", "batch_size must be a positive int, got 2.5"),  # was 2
        (",batch_size=-3", "batch_size must be a positive int"),
        (",dtype=int8", "dtype must be one of"),
    ],
)
def test_bad_model_args_are_refused_by_name(folder, extra, message):
    with pytest.raises(ValueError, match=message):
        harness_lm(folder, extra)


def test_a_missing_model_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="pretrained= must name a model folder"):
        RetrievalHarnessLM.create_from_arg_string(f"pretrained={tmp_path / 'none'}")
    with pytest.raises(ValueError, match="pretrained= must name a model folder"):
        RetrievalHarnessLM.create_from_arg_string("preset=retrieval")


def test_sampling_and_bad_generation_settings_are_refused():
    with pytest.raises(ValueError, match="greedily"):
        generation_settings({"do_sample": True, "temperature": 0.7})
    with pytest.raises(ValueError, match="max_gen_toks"):
        generation_settings({"max_gen_toks": 0})
    with pytest.raises(ValueError, match="until"):
        generation_settings({"until": [3]})
    with pytest.raises(ValueError, match="until must be a string or a list of strings, got 5"):
        generation_settings({"until": 5})  # was a bare TypeError ('int' is not iterable)
    with pytest.raises(ValueError, match="temperature must be a number, got 'hot'"):
        generation_settings({"temperature": "hot"})
    with pytest.raises(ValueError, match="max_gen_toks must be a positive int, got 'many'"):
        generation_settings({"max_gen_toks": "many"})
    with pytest.raises(ValueError, match="max_gen_toks must be a positive int, got 2.5"):
        generation_settings({"max_gen_toks": 2.5})
    assert generation_settings({"until": ("a", "b"), "max_gen_toks": 3.0}) == (["a", "b"], 3)
    from inftyformer.integrations.ruler_lm import positive_batch_size

    assert positive_batch_size("4") == 4 and positive_batch_size(None) == 1
    assert generation_settings({"until": "\n", "max_new_tokens": 5}) == (["\n"], 5)
    assert generation_settings({}) == ([], 256)


def test_stops_cut_at_the_first_of_any():
    assert cut_at_stops("a 12. b\n c", ["\n", "."]) == "a 12"
    assert cut_at_stops("abc", ["", "x"]) == "abc"


def test_log_likelihood_requests_say_what_to_use_instead(folder):
    lm = harness_lm(folder)
    with pytest.raises(NotImplementedError, match="generation requests only"):
        lm.loglikelihood([request("a")])


def test_a_cuda_device_where_there_is_none_is_the_cpu_as_for_lm_eval_hf_model():
    """lm_eval's command line asks for cuda:0 unless told."""
    assert pick_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert pick_device("cuda:0") == torch.device("cpu")
        assert pick_device(None) == torch.device("cpu")


def test_a_store_dir_shared_with_another_stream_keeps_each_streams_blocks(folder, tmp_path):
    """Another stream writes blocks into the same store_dir between every call of the
    harness's: the answers are those without a store_dir (before, both wrote from block 0 into
    one set of files and the harness read the other stream's blocks)."""
    from inftyformer.retrieval.store import BlockStore

    prompt = TEXT * 6
    (expected,) = harness_lm(folder).generate_until([request(prompt, max_gen_toks=8)])
    lm = harness_lm(folder, f",store_dir={tmp_path}")
    m = lm.model
    other = BlockStore(m.retrieving, m.kv_heads, m.config.block_size, m.head_dim, str(tmp_path))
    noise = torch.Generator().manual_seed(0)
    forward = m.forward

    def interleaved(*args, **kwargs):
        shape = (4, 2, m.kv_heads, m.config.block_size, m.head_dim)
        other.append({layer: 30 * torch.randn(shape, generator=noise) for layer in m.retrieving})
        return forward(*args, **kwargs)

    m.forward = interleaved
    (text,) = lm.generate_until([request(prompt, max_gen_toks=8)])
    assert other.count >= 8 and text == expected
    assert [p.name for p in tmp_path.iterdir()] == [other.folder.name]  # the harness's removed
    other.close()
