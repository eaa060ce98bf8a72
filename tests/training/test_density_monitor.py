"""Every training run shows whether its long-term reads depend on the query: per memory layer,
the median σ and μ's spread across queries in metrics.csv (and TensorBoard)."""

import math

import torch
from tiny_models import SORT, tiny, tiny_sorting, tiny_train

from inftyformer import MemoryLM
from inftyformer.core.attention import density_statistics
from inftyformer.training import Trainer, read_metrics
from inftyformer.training.density import DensityMonitor
from inftyformer.training.distributed import DistEnv


def test_density_statistics_by_hand():
    mu = torch.tensor([[[0.1, 0.3, 0.5]], [[0.9, 0.9, 0.9]], [[0.2, 0.2, 0.8]]])  # [3, 1, 3]
    sigma_sq = torch.tensor([0.04, 0.09, 0.16, 1.0, 1.0, 1.0, 0.25, 0.25, 0.25]).view(3, 1, 3)
    empty = torch.tensor([False, True, False])  # row 1 reads nothing: left out
    sigma_median, spread, rows = density_statistics(mu, sigma_sq, empty)
    assert rows.item() == 2
    # σ of rows 0 and 2: 0.2, 0.3, 0.4, 0.5, 0.5, 0.5; torch's median is the lower middle value
    assert math.isclose(sigma_median.item(), 0.4, rel_tol=1e-7)  # float32 σ² = 0.16
    want = (torch.tensor([0.1, 0.3, 0.5]).std() + torch.tensor([0.2, 0.2, 0.8]).std()) / 2
    assert math.isclose(spread.item(), want.item(), rel_tol=1e-6)
    assert [t.item() for t in density_statistics(mu, sigma_sq, torch.ones(3, dtype=bool))] == [
        0.0,
        0.0,
        0.0,
    ]


def test_monitor_matches_the_reads_of_a_stream():
    torch.manual_seed(0)
    config = tiny("infty", segment_len=8)
    model = MemoryLM(config).eval()
    monitor = DensityMonitor(model)
    reads: list[list[tuple]] = [[] for _ in model.blocks]
    for i, block in enumerate(model.blocks):
        block.long_term_attention.register_forward_hook(
            lambda m, a, o, i=i: reads[i].append(density_statistics(o.mu, o.sigma_sq, a[1].empty))
        )
    state = model.init_state(3)
    tokens = torch.randint(0, config.vocab_size, (3, 48))
    with torch.no_grad():
        for start in range(0, 48, 8):
            state = model(tokens[:, start : start + 8], state=state).state
    figures = monitor.metrics(DistEnv())
    for i, layer_reads in enumerate(reads):
        rows = sum(r for _, _, r in layer_reads)
        assert rows > 0
        sigma = sum(s * r for s, _, r in layer_reads) / rows
        spread = sum(m * r for _, m, r in layer_reads) / rows
        assert math.isclose(figures[f"density/L{i}/sigma_median"], sigma.item(), rel_tol=1e-9)
        assert math.isclose(figures[f"density/L{i}/mu_spread"], spread.item(), rel_tol=1e-9)
    assert monitor.metrics(DistEnv()) == {}  # read once: the next step starts afresh


def test_training_logs_density_per_memory_layer(tmp_path):
    run = tiny_train(tmp_path / "infty", task="sorting", steps=3, eval_every=3, test_batches=0)
    config = tiny_sorting("infty", n_layers=2)
    Trainer(run, SORT, config, echo=lambda s: None).fit()
    rows = [r for r in read_metrics(run.out_dir) if r["metric"].startswith("density/")]
    layers = config.n_layers
    for step in (1, 2, 3):
        names = {r["metric"] for r in rows if r["step"] == step and r["split"] == "train"}
        assert names == {
            f"density/L{i}/{m}" for i in range(layers) for m in ("sigma_median", "mu_spread")
        }
    assert all(r["value"] > 0 for r in rows)
    # at initialisation the default density's reads already depend on the query
    assert max(r["value"] for r in rows if r["metric"].endswith("mu_spread")) > 1e-2

    run = tiny_train(tmp_path / "xl", task="sorting", steps=2, eval_every=2, test_batches=0)
    Trainer(run, SORT, tiny_sorting("xl"), echo=lambda s: None).fit()
    assert not [r for r in read_metrics(run.out_dir) if r["metric"].startswith("density/")]
