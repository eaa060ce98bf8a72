"""The passkey probe: where the needle sits, how answers are read, and the accuracy loop on a
tiny model with and without memory."""

import pytest
from test_hf_training import save_pretrained

from inftyformer.data import ByteTokenizer, load_tokenizer
from inftyformer.model_kinds import PretrainedMemoryConfig, build_model
from inftyformer.tasks.passkey import NEEDLE, answer_of, make_example, passkey_accuracy


@pytest.mark.parametrize("distance", [0, 100, 700])
def test_the_needle_ends_at_the_asked_distance(distance):
    tok = ByteTokenizer()
    example = make_example(tok, total_tokens=1_000, distance=distance, seed=3)
    text = tok.decode(example.ids)
    needle = NEEDLE.format(key=example.key)
    assert text.count(example.key) == 2 and len(example.key) == 5
    after = len(text) - (text.index(needle) + len(needle))  # bytes = tokens here
    assert after == example.distance >= distance
    assert example.distance - distance < 100  # at most one filler sentence more
    assert abs(len(example.ids) - 1_000) < 200
    assert make_example(tok, 1_000, distance, seed=3) == example  # seeded


def test_answers_are_the_first_digits():
    assert answer_of(" 12345. Remember") == "12345"
    assert answer_of(" the key") == ""


@pytest.mark.parametrize("memory", [True, False])
def test_accuracy_loop_on_a_tiny_model(tmp_path, memory):
    base = save_pretrained(tmp_path / "base", "llama")
    settings = dict(memory=memory, segment_len=32, num_basis=8, num_samples=8)
    model = build_model(PretrainedMemoryConfig(base_model=str(base), **settings))
    tok = load_tokenizer(str(base))
    out = passkey_accuracy(model, tok, distances=[8, 64], samples=2, total_tokens=96,
                           max_new_tokens=3)  # fmt: skip
    assert set(out) == {8, 64}
    for result in out.values():
        assert 0.0 <= result["accuracy"] <= 1.0 and len(result["answers"]) == 2
