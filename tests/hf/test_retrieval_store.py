"""The retrieval's block store (`inftyformer.retrieval.store`): two streams given one folder
keep their blocks apart; a closed store says so; appends are whole or nothing (a short write,
a file-size limit) and safe from several threads; the folders a killed process left are swept;
a bfloat16 base's blocks keep their range."""

import errno
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from tiny_hf import V, forty_token_retrieval, tiny_base

from inftyformer.retrieval import store as store_module
from inftyformer.retrieval.model import RetrievalLM
from inftyformer.retrieval.store import BlockStore

PREFIX = "inftyformer-blocks-"

SMALL = dict(block_size=4, blocks=2, sink_blocks=1, window=16, segment_len=8)
SHAPE = (2, 2, 4, 8)  # [2, H_kv, B, d] of the stores made here


def tokens(seed: int, length: int = 40) -> torch.Tensor:
    return torch.randint(1, V, (1, length), generator=torch.Generator().manual_seed(seed))


def retrieval(**settings) -> RetrievalLM:
    base = tiny_base("llama", max_position_embeddings=512)
    return RetrievalLM(base, **{**SMALL, **settings}).eval()


def blocks(n: int, fill: float, layers=(0,)) -> dict[int, torch.Tensor]:
    """n blocks of each layer, block i holding fill + i everywhere."""
    values = fill + torch.arange(n, dtype=torch.float32)
    return {layer: values.view(n, 1, 1, 1, 1).expand(n, *SHAPE).clone() for layer in layers}


def small_store(folder=None, layers=(0,)) -> BlockStore:
    return BlockStore(list(layers), SHAPE[1], SHAPE[2], SHAPE[3], folder)


# ---------------------------------------------------------------- one folder, two streams
@torch.no_grad()
def test_two_streams_given_one_store_dir_read_their_own_blocks(tmp_path):
    """Stream A reads its chosen blocks after stream B stored its own in the same store_dir:
    the logits are those of A alone (each store writes a folder of its own)."""
    shared = retrieval(store_dir=str(tmp_path))
    alone = retrieval()
    a, b = tokens(1, 48), tokens(2, 48)
    state_a = shared(a[:, :40]).state
    state_b = shared(b[:, :40]).state  # writes blocks 0–4 too
    reference = alone(a[:, 40:], alone(a[:, :40]).state).logits
    torch.testing.assert_close(shared(a[:, 40:], state_a).logits, reference, rtol=0, atol=1e-5)
    assert state_a.store.folder != state_b.store.folder
    assert {state_a.store.folder.parent, state_b.store.folder.parent} == {tmp_path}
    folders = [state_a.store.folder, state_b.store.folder]
    state_a.store.close(), state_b.store.close()
    assert not any(f.exists() for f in folders) and tmp_path.is_dir()  # store_dir stays


def test_a_store_dir_given_as_a_path_is_a_path(tmp_path):
    model = retrieval(store_dir=tmp_path / "blocks")
    assert model.config.store_dir == str(tmp_path / "blocks")
    state = model.init_state(1)
    assert state.store.folder.parent == tmp_path / "blocks"
    state.store.close()


@torch.no_grad()
def test_a_closed_store_refuses_reads_and_appends_by_name():
    """Its file descriptors may be another store's by then: reading them would read that
    store's blocks (or fail with Errno 9)."""
    model, ids, state = forty_token_retrieval()
    folder = state.store.folder
    state.store.close()
    other = small_store(layers=model.retrieving)  # takes the freed descriptors
    other.append(blocks(5, 100.0, layers=model.retrieving))
    with pytest.raises(store_module.ClosedStoreError, match=f"block store {folder} is closed"):
        model(ids[:, :8], state)
    with pytest.raises(store_module.ClosedStoreError, match="cannot append blocks"):
        state.store.append(blocks(1, 0.0, layers=model.retrieving))
    assert issubclass(store_module.ClosedStoreError, ValueError)
    other.close()


def test_a_store_that_fails_to_open_leaves_no_folder_and_no_descriptor(tmp_path, monkeypatch):
    real, opened = os.open, []

    def failing(path, *args, **kwargs):  # the second layer's file cannot be opened
        if str(path).endswith("layer1.bin"):
            raise OSError(errno.EMFILE, "Too many open files", str(path))
        fd = real(path, *args, **kwargs)
        if str(path).endswith((".lock", ".bin")):  # the store's files (not rmtree's folders)
            opened.append(fd)
        return fd

    monkeypatch.setattr(os, "open", failing)
    with pytest.raises(OSError, match="Too many open files"):
        small_store(tmp_path, layers=(0, 1))
    monkeypatch.setattr(os, "open", real)
    assert list(tmp_path.iterdir()) == [] and len(opened) == 2  # the lock and layer 0's
    for fd in opened:
        with pytest.raises(OSError, match="Bad file descriptor"):
            os.fstat(fd)


# ---------------------------------------------------------------- whole appends or none
def test_a_short_write_is_finished_and_a_write_that_stops_is_named_and_undone(monkeypatch):
    store = small_store(layers=(0, 1))
    store.append(blocks(2, 0.0, layers=(0, 1)))
    real = os.pwrite
    calls = []

    def half(fd, data, offset):  # the first call writes half; then as `then` says
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, bytes(data)[: len(data) // 2], offset)
        return then(fd, data, offset)

    then = real
    monkeypatch.setattr(os, "pwrite", half)
    ids = store.append(blocks(3, 10.0, layers=(0, 1)))
    assert ids.tolist() == [2, 3, 4] and len(calls) == 3  # half, the rest, the other layer
    assert store.read(0, ids)[:, 0, 0, 0, 0].tolist() == [10.0, 11.0, 12.0]

    calls.clear()
    then = lambda fd, data, offset: 0  # noqa: E731  (a write that makes no progress)
    with pytest.raises(OSError, match="layer0.bin") as err:
        store.append(blocks(1, 50.0, layers=(0, 1)))
    assert err.value.errno == errno.EIO and err.value.filename.endswith("layer0.bin")
    assert store.count == 5  # nothing half recorded, and the files cut back to 5 blocks
    assert {os.path.getsize(store.folder / f"layer{i}.bin") for i in (0, 1)} == {5 * store.record}
    monkeypatch.setattr(os, "pwrite", real)
    ids = store.append(blocks(1, 70.0, layers=(0, 1)))
    assert ids.tolist() == [5] and store.read(1, ids)[0, 1, 1, 3, 7] == 70.0
    store.close()


LIMITED = """
import resource, sys, torch
sys.path.insert(0, {tests!r})
from test_retrieval_store import blocks, small_store
store = small_store({folder!r}, layers=(0, 1))
record = store.record
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(2.5 * record), hard))  # 2.5 blocks a file
store.append(blocks(2, 0.0, layers=(0, 1)))
try:
    store.append(blocks(2, 10.0, layers=(0, 1)))  # the second block passes the limit
except OSError as err:
    print("raised", err.errno, err.filename, store.count)
import os
print("sizes", [os.path.getsize(store.folder / f"layer{{i}}.bin") // record for i in (0, 1)])
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
ids = store.append(blocks(2, 20.0, layers=(0, 1)))
print("then", ids.tolist(), store.read(0, ids)[:, 0, 0, 0, 0].tolist())
"""


def test_a_file_size_limit_fails_the_append_that_meets_it_naming_the_file(tmp_path):
    """Under `ulimit -f` the append that passes the limit raises Errno 27 naming the layer's
    file; no half block is recorded (before: it "succeeded" with half a block, the next append
    failed, and the half block read back as zeros)."""
    script = LIMITED.format(tests=str(Path(__file__).parent), folder=str(tmp_path))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.strip().splitlines())
    code, filename, count = lines["raised"].split(" ")
    assert int(code) == errno.EFBIG and filename.endswith("layer0.bin") and count == "2"
    assert lines["sizes"] == "[2, 2]"
    assert lines["then"] == "[2, 3] [20.0, 21.0]"


def test_appends_from_several_threads_get_their_own_ids_and_blocks(monkeypatch):
    store = small_store()
    got: dict[int, list[int]] = {}

    def worker(t: int) -> None:
        mine = got.setdefault(t, [])
        for i in range(300):
            mine += store.append(blocks(1, 400.0 * t + i)).tolist()  # exact in float16

    real = os.pwrite

    def slow(fd, data, offset):  # a write that lets the other threads run meanwhile (as a
        time.sleep(1e-4)  # busy disk does): a race between reserving ids and writing shows
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", slow)
    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    ids = [i for t in range(4) for i in got[t]]
    assert sorted(ids) == list(range(1200)) and store.count == 1200
    for t in range(4):
        read = store.read(0, torch.tensor(got[t]))  # [300, 2, H, B, d]
        expected = 400.0 * t + torch.arange(300.0)
        assert torch.equal(read.float().amin((1, 2, 3, 4)), expected)
        assert torch.equal(read.float().amax((1, 2, 3, 4)), expected)
    store.close()


def test_a_keys_only_read_is_the_first_half_of_each_block_and_checks_ids_alike():
    """`read(keys_only=True)`: the keys of the blocks asked, in their order and shape, as the
    whole read gives them; ids past the stored refused the same way."""
    store = small_store(layers=(0, 1))
    data = {layer: torch.randn(5, *SHAPE, generator=torch.Generator().manual_seed(layer))
            for layer in (0, 1)}  # fmt: skip
    store.append(data)
    ids = torch.tensor([[3, 0], [4, 4]])
    whole = store.read(1, ids)  # [2, 2, 2, H, B, d]
    keys = store.read(1, ids, keys_only=True)  # [2, 2, H, B, d]
    assert keys.shape == (2, 2, *SHAPE[1:])
    assert torch.equal(keys, whole[:, :, 0])
    assert torch.equal(keys[0, 0], data[1][3, 0].to(store.dtype))
    with pytest.raises(IndexError, match="outside the 5 stored"):
        store.read(0, torch.tensor([5]), keys_only=True)
    store.close()


# ---------------------------------------------------------------- leftovers of killed processes
def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_the_folders_of_killed_processes_are_swept_and_the_others_kept(tmp_path, monkeypatch):
    import fcntl

    dead = dead_pid()
    gone = tmp_path / f"{PREFIX}{dead}-abc"
    live = tmp_path / f"{PREFIX}{os.getpid()}-def"
    held = tmp_path / f"{PREFIX}{dead}-ghi"  # a dead pid here, but its lock is held
    unnamed = tmp_path / f"{PREFIX}xyz"  # no pid: nothing says whose it is
    for folder in (gone, live, held, unnamed):
        folder.mkdir()
        (folder / "layer0.bin").write_bytes(b"\0" * 64)
    fd = os.open(held / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        store = small_store(tmp_path)
        assert not gone.exists()
        assert live.exists() and held.exists() and unnamed.exists()
        assert store.folder.name.startswith(f"{PREFIX}{os.getpid()}-")
        store.close()
    finally:
        os.close(fd)
    # the temporary folder too, where a store without store_dir writes
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    gone.mkdir()
    store = small_store()
    assert store.folder.parent == tmp_path and not gone.exists()
    assert not held.exists() and live.exists()  # its lock is free now
    store.close()


# ---------------------------------------------------------------- the store's dtype
@torch.no_grad()
def test_a_bfloat16_bases_blocks_are_stored_in_bfloat16_past_float16s_range():
    """Values past 65,504 (float16's largest): a bfloat16 base's stored blocks keep them (they
    read back as inf in float16, and the logits as NaN)."""
    base = tiny_base("llama", max_position_embeddings=512).to(torch.bfloat16)
    base.model.layers[1].self_attn.v_proj.weight.mul_(3e6)  # values ~1e5 in the retrieving block
    model = RetrievalLM(base, **SMALL).eval()
    state = model(tokens(1)).state
    stored = state.store.read(1, state.block_ids[0])
    assert stored[:, 1].float().abs().amax() > 65504 and torch.isfinite(stored).all()
    assert torch.isfinite(model(tokens(3, 8), state).logits.float()).all()
    assert state.store.dtype == torch.bfloat16 and state.keys[0].dtype == torch.bfloat16
    state.store.close()


def test_a_value_past_float16s_range_is_refused_by_a_float16_store():
    store = small_store(layers=(0, 3))
    big = blocks(2, 1e5, layers=(0, 3))
    with pytest.raises(ValueError, match=r"layer 0's block keys/values holds 1e\+05, past float16"):
        store.append(big)
    assert store.count == 0 and os.path.getsize(store.folder / "layer3.bin") == 0
    assert torch.equal(store.append(blocks(1, 65504.0, layers=(0, 3))), torch.tensor([0]))
    store.close()
