"""The Hugging Face tests need the optional extra (inftyformer[hf]); CI installs it."""

import pytest

pytest.importorskip("transformers")

from tiny_hf import ARCHITECTURES  # noqa: E402


@pytest.fixture(params=ARCHITECTURES)
def arch(request):
    return request.param
