"""inftyformer._measure's resident-memory readings: a peak set back to the current RSS measures
only what comes after (how experiments/ruler.py gives each cell its own peak)."""

import numpy as np
import pytest

from inftyformer._measure import peak_rss_mb, reset_peak_rss, rss_mb


def test_a_reset_peak_forgets_an_earlier_allocation():
    block = np.ones(64 * 1024 * 1024 // 8)  # 64 MiB, touched
    block.sum()
    del block
    before = peak_rss_mb()
    if not reset_peak_rss():
        pytest.skip("this kernel does not let a process reset its peak RSS")
    after = peak_rss_mb()
    assert after < before - 32  # the 64 MiB are no longer in the peak
    assert after == pytest.approx(rss_mb(), abs=8)
    again = np.ones(64 * 1024 * 1024 // 8)
    again.sum()
    assert peak_rss_mb() > after + 32  # and a later allocation is
