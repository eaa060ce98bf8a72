"""`segment_len` (the tokens of one call, and of one memory update) is declared once per model
kind, in its config, and read from there by everything else: every config checks it with one
function (`_checks.check_segment_len`), a long-term memory gets it from its model's config, and
the whole-document evaluation cuts its calls as the model's config says, also after that config
was changed. No other class or function declares a default of its own (scanned below)."""

import ast
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import V, tiny

from inftyformer.core.config import LongTermConfig
from inftyformer.data import TokenizedCorpus
from inftyformer.integrations.lm_eval import LMEvalConfig, evaluate_lm
from inftyformer.native.model import MemoryLM
from inftyformer.native.streaming import stream_loss
from inftyformer.pretrained_config import AdapterConfig
from inftyformer.retrieval.config import RetrievalConfig

SRC = Path(__file__).resolve().parents[2] / "src" / "inftyformer"

# each model kind's config: the one place its segment_len is declared
CONFIGS = {
    "native": lambda L: tiny("infty", segment_len=L),
    "pretrained adapter": lambda L: AdapterConfig(segment_len=L),
    "retrieval": lambda L: RetrievalConfig(segment_len=L),
    "long-term memory (handed down)": lambda L: LongTermConfig(segment_len=L),
}


def recorded_widths(model) -> list[int]:
    """The number of tokens of each call of `model` (its input [batch, T]), as they happen."""
    widths: list[int] = []
    model.register_forward_pre_hook(lambda _, args: widths.append(args[0].shape[1]))
    return widths


@pytest.mark.parametrize("kind", CONFIGS)
@pytest.mark.parametrize(
    "bad, error, message",
    [
        (0, ValueError, "segment_len must be >= 1, got 0"),
        (-3, ValueError, "segment_len must be >= 1, got -3"),
        ("8", TypeError, r"segment_len must be an int, got str \('8'\)"),
        (8.0, TypeError, r"segment_len must be an int, got float \(8.0\)"),
        (True, TypeError, r"segment_len must be an int, got bool \(True\)"),
    ],
)
def test_every_config_checks_segment_len_alike(kind, bad, error, message):
    assert CONFIGS[kind](5).segment_len == 5
    with pytest.raises(error, match=message):
        CONFIGS[kind](bad)


def test_the_memory_of_a_model_gets_the_model_segment_len():
    config = tiny("infty", segment_len=6)
    assert config.long_term.segment_len is None  # nested: not a setting of its own
    assert config.long_term_config().segment_len == 6
    changed = config.with_memory_settings({"segment_len": 10})
    assert changed.long_term_config().segment_len == 10
    with pytest.raises(ValueError, match="long_term.segment_len is the model's"):
        tiny("infty", long_term=LongTermConfig(segment_len=6))


def test_a_stream_may_cap_its_calls_below_the_model_segment_len_only():
    model = MemoryLM(tiny("xl", segment_len=6)).eval()
    ids = torch.randint(0, V, (1, 20), generator=torch.Generator().manual_seed(0))
    widths = recorded_widths(model)
    stream_loss(model, ids, ids)
    assert widths == [6, 6, 6, 2]  # the model's
    widths.clear()
    stream_loss(model, ids, ids, segment_len=4)  # shorter, within the model's blocks of 6
    assert widths == [4, 2, 4, 2, 4, 2, 2]
    with pytest.raises(ValueError, match="segment_len 7 exceeds the model's segment_len 6"):
        stream_loss(model, ids, ids, segment_len=7)


def test_the_evaluation_cuts_its_calls_as_the_model_config_says():
    """evaluate_lm has no segment length of its own: a model whose config was changed to
    another segment_len (same weights) is called with that many tokens, and gives the NLL of
    streaming each document through it in calls of that length."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, V - 1, size=n) for n in (23, 9, 31)]
    corpus = TokenizedCorpus.from_documents(docs, vocab_size=V, eos_id=V - 1)
    assert "segment_len" not in LMEvalConfig.__dataclass_fields__
    first = MemoryLM(tiny("infty", segment_len=8)).eval()
    for L in (8, 5):
        model = MemoryLM(first.config.with_memory_settings({"segment_len": L})).eval()
        model.load_state_dict(first.state_dict())
        widths = recorded_widths(model)
        result = evaluate_lm(model, corpus, LMEvalConfig(batch_size=1))
        steps = sum(math.ceil((len(d) + 1) / L) for d in docs)  # a BOS before each document
        assert widths == [L] * steps
        expected = 0.0
        with torch.no_grad():
            for doc in docs:
                stream = torch.as_tensor(np.concatenate([[V - 1], doc]))[None]
                nll, _ = stream_loss(model, stream[:, :-1], stream[:, 1:])
                expected += float(nll.double().sum())
        assert result.nll_sum == pytest.approx(expected, rel=1e-5)


# ---------------------------------------------------------------- no second declaration
# (file, class) whose `segment_len` field has a default: the model kinds' configs, and the
# long-term memory's (None, filled in from its model's config by `LongTermConfig.sized`)
DECLARED = {
    ("native/model_config.py", "ModelConfig"),
    ("pretrained_config.py", "AdapterConfig"),
    ("retrieval/config.py", "RetrievalConfig"),
    ("core/config.py", "LongTermConfig"),
}
# functions whose `segment_len` parameter defaults to a number: the demo streams a bare memory,
# with no model whose config could say it (`demo.run_demo`, and the command that runs it)
OWN_DEFAULT = {("demo.py", "run_demo"), ("cli.py", "demo")}


def _declarations():
    """(file, owner, default source) of every `segment_len` given a default in the package:
    class fields, and function parameters whose default is not None (None: the model's)."""
    for path in sorted(SRC.rglob("*.py")):
        name = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    target = getattr(item, "target", None)
                    if isinstance(item, ast.AnnAssign) and item.value is not None:
                        if isinstance(target, ast.Name) and target.id == "segment_len":
                            yield name, node.name, ast.unparse(item.value)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                pairs = list(
                    zip(
                        positional[len(positional) - len(args.defaults) :],
                        args.defaults,
                        strict=True,
                    )
                )
                pairs += [
                    (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d
                ]
                for arg, default in pairs:
                    is_none = isinstance(default, ast.Constant) and default.value is None
                    if arg.arg == "segment_len" and not is_none:
                        yield name, node.name, ast.unparse(default)


def test_no_second_default_of_segment_len_is_declared():
    found = {(f, owner) for f, owner, _ in _declarations()}
    assert found - DECLARED - OWN_DEFAULT == set(), (
        "segment_len is declared once per model kind, in its config; read it from the model "
        "or config at hand instead of declaring another default"
    )
    assert DECLARED <= found  # the scan sees the real declarations
