"""The presets the package retired, kept as settings on the default preset for the experiments
that measured them: each must still read as the preset did."""

import pytest
from _retired_presets import NEAR, PICKED, PRESET, RETIRED, model_args, preset_of, row_settings

from inftyformer.presets import PRESETS
from inftyformer.retrieval import RetrievalConfig
from inftyformer.retrieval.layouts import NearestLayout
from inftyformer.retrieval.scorers import AttentionChoice, MaxChoice

# the presets as the package registered them (its settings, written out as strategies)
AS_REGISTERED = {
    NEAR: RetrievalConfig(block_size=64, sink_blocks=1, window=448, segment_len=256,
                          choice=MaxChoice(blocks=24, read_from=0), layout=NearestLayout()),
    PICKED: RetrievalConfig(block_size=64, sink_blocks=1, window=256, segment_len=256,
                            choice=AttentionChoice(blocks=2, neighbours=1, read_from=0,
                                                   answer_choice="question", select_queries=32)),
}  # fmt: skip


@pytest.mark.parametrize("row", [NEAR, PICKED])
def test_a_retired_preset_reads_as_it_was_registered(row):
    preset, on_top = preset_of(row)
    assert row not in PRESETS and preset == PRESET  # not offered by the package any more
    assert RetrievalConfig.from_preset(preset, **on_top) == AS_REGISTERED[row]
    assert row_settings(row) == AS_REGISTERED[row].settings()
    # as lm_eval hands its model_args to the harness model: text, typed back by lm_eval
    lm_eval_utils = pytest.importorskip("lm_eval.utils")
    parsed = lm_eval_utils.simple_parse_args_string(model_args(RETIRED[row]))
    assert RetrievalConfig.from_preset(PRESET, **parsed) == AS_REGISTERED[row]


def test_a_preset_of_the_package_is_itself_with_nothing_on_top():
    assert preset_of("streaming") == ("streaming", {})
    # the default's question settings do not reach a retired row: they drop with its choice
    assert "question_window" not in row_settings(NEAR)
    assert row_settings("retrieval")["question_window"] == 256
