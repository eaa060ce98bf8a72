"""Data-parallel training: `inftyformer train` under torchrun with 2 CPU processes (gloo) ends
with the parameters of a single-process run on the same global batches."""

import os
import subprocess

import pytest
import torch
from tiny_models import SORT, tiny_sorting, tiny_train, torchrun_cli

from inftyformer.training import Trainer, load_checkpoint, read_metrics

MODEL_SETTINGS = dict(
    d_model=16,
    n_layers=1,
    n_heads=2,
    d_ff=32,
    segment_len=32,
    mem_len=32,
    num_basis=8,
    num_samples=16,
    dropout=0.0,  # dropout masks are per rank: they would differ from one process's
)


@pytest.mark.slow
def test_two_process_ddp_matches_single_process(tmp_path):
    steps, batch = 3, 4
    single = Trainer(
        tiny_train(tmp_path / "single", steps=steps, batch_size=batch, eval_every=steps),
        SORT,
        tiny_sorting(**MODEL_SETTINGS),
        echo=lambda s: None,
    )
    single.fit()

    out = tmp_path / "ddp"
    cmd = torchrun_cli(
        "train", "sorting", "--model", "infty", "--seq-len", 96, "--steps", steps,
        "--batch-size", batch, "--eval-every", steps, "--threads", 1, "--no-progress",
        "--out-dir", out,
    )  # fmt: skip
    train_settings = dict(
        warmup_steps=2, eval_batches=1, test_batches=1, log_every=1, tensorboard="false"
    )
    for key, value in {**MODEL_SETTINGS, **train_settings}.items():
        cmd += ["--set", f"{key}={value}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout and proc.stdout.count("training infty") == 1

    ckpt = load_checkpoint(out / "last")
    assert ckpt.meta["world_size"] == 2 and len(ckpt.meta["ranks"]) == 2
    ddp_params = ckpt.section("model")
    for name, p in single.model.state_dict().items():
        diff = (p - ddp_params[name]).abs().max().item()
        assert diff < 1e-5, (name, diff)

    def losses(run):
        return [
            r["value"] for r in read_metrics(run) if r["split"] == "train" and r["metric"] == "loss"
        ]

    assert torch.allclose(
        torch.tensor(losses(out)), torch.tensor(losses(tmp_path / "single")), atol=1e-5
    )


def test_wrapping_a_model_for_ddp_warns_nothing(tmp_path):
    """The user did not cause a deprecation warning of DDP's options: none is printed."""
    import warnings

    import torch.distributed as dist

    from inftyformer.training.distributed import DistEnv, wrap_model

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = wrap_model(torch.nn.Linear(2, 2), DistEnv(world_size=2))
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        assert [str(w.message) for w in caught] == []
        synced = getattr(wrapped, "forward_sync_buffers", getattr(wrapped, "broadcast_buffers", 1))
        assert not synced  # buffers are not broadcast at every forward
    finally:
        dist.destroy_process_group()
