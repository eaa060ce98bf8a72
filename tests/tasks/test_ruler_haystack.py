"""RULER's essay-haystack tasks on the package's novels (`inftyformer.integrations.ruler_haystack`):
the
haystack, the Punkt model learned offline, and lm_eval's prompts made from them."""

import re

import pytest

pytest.importorskip("lm_eval")
nltk = pytest.importorskip("nltk")

from nltk.tokenize.punkt import PunktSentenceTokenizer, load_punkt_params  # noqa: E402
from tiny_pretrained import write_tiny_model  # noqa: E402

from inftyformer.integrations import ruler_haystack as rh  # noqa: E402

# a key may hold a space
NEEDLE = re.compile(r"One of the special magic numbers for (.+?) is: (\d+)\.")


def story(sentences: int = 300, seed: int = 0) -> str:
    """Prose with titles ("Mr.", "Mrs.") that end in a period inside a sentence."""
    import random

    r = random.Random(seed)
    names, verbs = ["Smith", "Brown", "Elton", "Weston"], ["came in", "sat down", "smiled"]
    said = []
    for _ in range(sentences):
        said.append(f"{r.choice(['Mr.', 'Mrs.'])} {r.choice(names)} {r.choice(verbs)}.")
        said.append(f"The {r.choice(['day', 'room'])} was {r.choice(['long', 'cold'])}.")
    return " ".join(said)


@pytest.fixture
def nltk_path(monkeypatch):
    """nltk's data path as it was after the test (a test's model folder is not left on it)."""
    monkeypatch.setattr(nltk.data, "path", list(nltk.data.path))


def test_the_haystack_is_the_text_split_at_every_run_of_white_space():
    assert rh.haystack("Emma  Woodhouse,\n\nhandsome,\tclever") == [
        "Emma", "Woodhouse,", "handsome,", "clever",
    ]  # fmt: skip


def test_the_novels_come_split_by_split_then_by_name(tmp_path):
    names = [p.name for p in rh.book_files()]
    assert names == [
        "emma.txt", "mansfield-park.txt", "pride-and-prejudice.txt",
        "sense-and-sensibility.txt", "northanger-abbey.txt", "persuasion.txt",
    ]  # fmt: skip
    with pytest.raises(FileNotFoundError, match="split folder not found"):
        rh.book_files(tmp_path)


def test_the_punkt_model_keeps_the_texts_titles_and_is_made_once(tmp_path, nltk_path):
    text = story()
    root = rh.punkt_root(text, tmp_path)
    english = root / "tokenizers/punkt_tab/english"
    nltk.data.path.insert(0, str(root))  # first: nltk reads a model only from its data path
    params = load_punkt_params(nltk.data.find("tokenizers/punkt_tab/english/"))
    assert {"mr", "mrs"} <= params.abbrev_types
    said = "Mr. Smith said so. Mrs. Elton said no."
    assert PunktSentenceTokenizer(params).tokenize(said) == [
        "Mr. Smith said so.",
        "Mrs. Elton said no.",
    ]
    # untrained, Punkt ends a sentence at each title: the model is what keeps them
    assert PunktSentenceTokenizer().tokenize(said)[0] == "Mr."
    made = {p.name: p.stat().st_mtime_ns for p in english.iterdir()}
    assert rh.punkt_root(text, tmp_path) == root  # found again, not made again
    assert {p.name: p.stat().st_mtime_ns for p in english.iterdir()} == made
    assert [p.name for p in tmp_path.iterdir()] == [root.name]  # no temporary left
    assert rh.punkt_root(text + " The end.", tmp_path) != root  # another text, another model


def test_a_multikey_prompt_holds_four_needles_in_the_text_and_asks_one(tmp_path, nltk_path):
    folder = write_tiny_model(tmp_path / "model", corpus=(story(40),) * 5, vocab_size=400)
    text = story(2000, seed=1)
    data = rh.books_samples(
        "niah_multikey_1", text=text, cache_dir=tmp_path / "cache",
        max_seq_lengths=[1024], pretrained=str(folder),
    )["test"]  # fmt: skip
    assert len(data) == 500
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    for doc in data.select(range(50)):
        prompt = doc["input"]
        needles = dict(NEEDLE.findall(prompt))
        asked = re.search(r"special magic number for (.+?) mentioned", prompt).group(1)
        assert len(needles) == 4 and doc["outputs"] == [needles[asked]]
        assert prompt.startswith("A special magic number is hidden within the following text.")
        haystack = NEEDLE.sub(" ", prompt.split("\n")[1])
        assert text.startswith(" ".join(haystack.split()[:20]))  # the text, from its opening
        assert doc["length"] == len(tokenizer(prompt).input_ids) + 128 <= 1024  # + answer


def test_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown task 'niah_single_9'.*niah_multikey_1"):
        rh.books_samples("niah_single_9", text="a b c")


@pytest.mark.slow
def test_lm_eval_loads_the_books_tasks_from_their_folder(tmp_path, nltk_path, monkeypatch):
    """The yaml folder as lm_eval's --include_path: every task listed, and a task's requests
    made from the novels (their Punkt model learned once, into the cache folder)."""
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("INFTYFORMER_CACHE", str(tmp_path / "cache"))
    folder = write_tiny_model(tmp_path / "model", corpus=(story(40),) * 5, vocab_size=400)
    # 8,192 tokens: 500 words at least (the generator's step), this tokenizer spelling them
    metadata = {"pretrained": str(folder), "max_seq_lengths": [8192]}
    manager = TaskManager(include_path=str(rh.TASKS_DIR), include_defaults=False, metadata=metadata)
    assert {f"{t}_books" for t in rh.NEEDLES} <= set(manager.all_tasks)
    assert "ruler_books" in manager.all_tasks
    task = manager.load(["niah_single_2_books"])["tasks"]["niah_single_2_books"]
    task.build_all_requests(limit=2, rank=0, world_size=1)
    prompt, settings = task.instances[0].args
    haystack = NEEDLE.sub(" ", prompt.split("\n")[1]).split()
    assert haystack[:9] == "EMMA By Jane Austen VOLUME I CHAPTER I Emma".split()
    [(_, value)] = NEEDLE.findall(prompt)
    assert task.instances[0].doc["outputs"] == [value]
    assert settings["max_gen_toks"] == 128 and not settings["do_sample"]
    assert len(list((tmp_path / "cache").glob("punkt-*"))) == 1
