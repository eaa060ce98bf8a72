"""`--set help`: each setting's type, default and meaning, read from the configs themselves."""

from dataclasses import dataclass

import pytest

from inftyformer.native.model_config import ModelConfig
from inftyformer.pretrained_config import PretrainedMemoryConfig
from inftyformer.settings_help import describe_settings, field_notes
from inftyformer.tasks import get_task
from inftyformer.training.config import TrainConfig


@dataclass
class Example:
    """An example.

    alpha    the doc row's meaning
    """

    alpha: int = 1
    beta: float = 2.0  # the trailing comment
    # the comment block above,
    # joined
    gamma: str = "g"
    delta: bool = False


def test_meanings_come_from_comments_blocks_and_doc_rows():
    assert field_notes(Example) == {
        "alpha": "the doc row's meaning",
        "beta": "the trailing comment",
        "gamma": "the comment block above, joined",
    }
    rows = {r[0]: r for r in describe_settings(Example)}
    assert rows["delta"] == ("delta", "bool", "False", "–")
    assert rows["beta"][1:3] == ("float", "2.0")


@pytest.mark.parametrize(
    "cls",
    [ModelConfig, PretrainedMemoryConfig, TrainConfig,
     *(get_task(t).Config for t in ("sorting", "lm", "recall", "facts", "dialogue"))],
)  # fmt: skip
def test_every_setting_a_user_can_give_states_its_meaning(cls):
    missing = [r[0] for r in describe_settings(cls) if r[3] == "–"]
    assert not missing, f"{cls.__name__}: give these a comment in the config: {missing}"


def test_defaults_are_the_class_defaults_with_its_memory_flat():
    rows = {r[0]: r for r in describe_settings(ModelConfig)}
    assert rows["num_basis"][2] == "128"  # the native model's memory, not LongTermConfig's 256
    assert rows["density"][2] == "'normalized'" and "content" in rows["density"][3]
    assert rows["keep_first"][2] == "0 (squeeze fill)"  # a strategy not chosen by default
    pretrained = {r[0]: r for r in describe_settings(PretrainedMemoryConfig)}
    assert pretrained["memory_read"][2] == "'added'" and pretrained["tau"][2] == "0.5"
