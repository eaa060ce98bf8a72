"""Shared test set-up: one torch thread, and the one way to reach the shared data."""

from pathlib import Path

import pytest
import torch

from inftyformer.data import default_data_dir


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests use tiny matrices: one thread is fastest, and the machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared data directory (../shared/data or $INFTYFORMER_DATA); tests that need it skip
    when it is absent."""
    found = default_data_dir()
    if found is None:
        pytest.skip("the shared data directory (../shared/data or $INFTYFORMER_DATA) is absent")
    return found
