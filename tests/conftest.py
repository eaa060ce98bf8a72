"""Shared test set-up."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """Tests use tiny matrices: one thread is fastest, and the machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
