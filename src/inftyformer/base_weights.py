"""The pretrained base that an adapter checkpoint refers to instead of holding (`docs/hf.md`).

A run that trains only the memory on a frozen pretrained model (`--freeze-base`) saves what it
trains, the memory's weights and their optimiser state, plus a `BaseReference`: the base's
directory and a hash of its weights. Loading rebuilds the base from that directory (or from the
one given with `--base-model`, when it moved) and refuses it when its hash differs, since the
memory was trained on that base's hidden states and means nothing on another's.

What is hashed (`weights_hash`): the tensors, not the files. For every tensor of the directory's
safetensors weights (`model.safetensors`, or the shards its index names, or every
`*.safetensors`), the line ``name dtype shape sha256-of-its-bytes``; the hash is the sha256 of
these lines in name order. So a base re-saved with other file metadata or cut into other shards
keeps its hash, and one changed number anywhere changes it. A base without safetensors files
(`pytorch_model*.bin`) is hashed by the bytes of those files. Each file is read once per process
(cached by its path, size and modification time): about a second for SmolLM2-135M's 540 MB.

The weights are not all a model's behaviour: `rope_theta`, `hidden_act`, the norms' epsilon and
the like live in its config.json, and the same weights under another config give other logits.
So what is recorded beside the hash is the base's `behaviour_config`: its config as transformers
reads it (defaults filled in, older spellings normalised) without the entries that do not change
what it computes (`NOT_BEHAVIOUR`: file metadata, output switches, labels, token ids, the
initialisation's scale); `check_config` refuses a base whose behaviour config differs, naming
the entries.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_CACHE: dict[tuple[str, int, int], list[str]] = {}

# config.json entries that do not change what a model computes from its weights
NOT_BEHAVIOUR = frozenset(
    {
        "_name_or_path",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "return_dict",
        "output_hidden_states",
        "output_attentions",
        "torchscript",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "id2label",
        "label2id",
        "problem_type",
        "finetuning_task",
        "task_specific_params",
        "tokenizer_class",
        "prefix",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "initializer_range",
        "chunk_size_feed_forward",
        "auto_map",
        "_commit_hash",
    }
)


class BaseMismatchError(ValueError):
    """The base model given to an adapter is not the one it was trained on."""


def weight_files(directory: Path) -> list[Path]:
    """The files holding a model directory's weights."""
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{index} is not a readable safetensors index: {err}") from None
        return [directory / name for name in sorted(names)]
    found = sorted(directory.glob("*.safetensors"))
    return found or sorted(directory.glob("pytorch_model*.bin"))


def _safetensors_lines(path: Path, data: mmap.mmap) -> list[str]:
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + size])
        start = 8 + size
        lines = []
        with memoryview(data) as view:
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                begin, end = info["data_offsets"]
                digest = hashlib.sha256(view[start + begin : start + end]).hexdigest()
                shape = "x".join(str(n) for n in info["shape"])
                lines.append(f"{name} {info['dtype']} {shape} {digest}")
    except (struct.error, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from None
    return lines


def _file_lines(path: Path) -> list[str]:
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        if stat.st_size == 0:
            raise ValueError(f"{path} is empty")
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            if path.suffix == ".safetensors":
                _CACHE[key] = _safetensors_lines(path, data)
            else:
                _CACHE[key] = [f"file:{path.name} {hashlib.sha256(data).hexdigest()}"]
    return _CACHE[key]


def weights_hash(directory: str | Path) -> str:
    """The sha256 of the weights in model directory `directory` (see the module docstring)."""
    directory = Path(directory).expanduser()
    files = weight_files(directory)
    if not files:
        raise ValueError(f"{directory} holds no model weights (*.safetensors or *.bin)")
    lines = sorted(line for path in files for line in _file_lines(path))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def behaviour_config(directory: str | Path) -> dict[str, Any]:
    """What a model's outputs depend on in `directory`'s config.json (module docstring), as
    JSON values."""
    from transformers import AutoConfig

    directory = Path(directory).expanduser()
    try:
        config = AutoConfig.from_pretrained(str(directory)).to_dict()
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{directory / 'config.json'} cannot be read: {err}") from None
    kept = {k: v for k, v in config.items() if k not in NOT_BEHAVIOUR}
    return json.loads(json.dumps(kept, sort_keys=True, default=str))


def config_hash(config: dict[str, Any]) -> str:
    """The sha256 of a behaviour config (sorted JSON)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(config, dict):
        return {prefix: config}
    out: dict[str, Any] = {}
    for key, value in config.items():
        out.update(_flat(value, f"{prefix}{key}."))
    return {k.rstrip("."): v for k, v in out.items()}


def check_config(
    saved: dict[str, Any], directory: str | Path, option: str = "--base-model", what: str = "this"
) -> None:
    """Refuse (BaseMismatchError) the base in `directory` when its behaviour config is not
    `saved`, the one `what` was trained on, naming the entries that differ."""
    found = behaviour_config(directory)
    if config_hash(found) == config_hash(saved):
        return
    old, new = _flat(saved), _flat(found)
    differ = sorted(k for k in set(old) | set(new) if old.get(k, "unset") != new.get(k, "unset"))
    shown = "; ".join(f"{k}: {old.get(k, 'unset')!r} -> {new.get(k, 'unset')!r}" for k in differ)
    raise BaseMismatchError(
        f"the base model in {Path(directory).expanduser().resolve()} has another config.json "
        f"than the one {what} was trained with ({shown[:400]}): its weights would compute "
        f"other outputs; restore its config.json or point {option} at the original base's "
        "folder"
    )


@dataclass(frozen=True)
class BaseReference:
    """The base an adapter loads on top of: where it was (`path`, absolute), its weights'
    `weights_hash`, and where its tensors sit in the state dict of the model holding it
    (`prefix`, e.g. "lm.base."; they are left out of the adapter's tensors)."""

    path: str
    sha256: str
    prefix: str = ""

    @classmethod
    def of(cls, directory: str | Path, prefix: str = "") -> BaseReference:
        path = Path(directory).expanduser().resolve()
        return cls(str(path), weights_hash(path), prefix)

    def to_dict(self) -> dict[str, str]:
        return {"path": self.path, "sha256": self.sha256, "prefix": self.prefix}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BaseReference:
        if not (
            isinstance(data, dict)
            and all(isinstance(data.get(k), str) for k in ("path", "sha256", "prefix"))
        ):
            raise ValueError(f"{where}: the base reference must hold path, sha256 and prefix")
        return cls(data["path"], data["sha256"], data["prefix"])

    def check(self, directory: str | Path, option: str = "--base-model") -> str:
        """The hash of `directory`'s weights, or a BaseMismatchError naming both bases when it
        is not this reference's."""
        found = weights_hash(directory)
        if found != self.sha256:
            raise BaseMismatchError(
                f"the base model in {Path(directory).expanduser().resolve()} (weights sha256 "
                f"{found[:16]}…) is not the one this was trained on ({self.path}, sha256 "
                f"{self.sha256[:16]}…): point {option} at that base's folder (or an exact copy "
                "of it)"
            )
        return found


__all__ = [
    "NOT_BEHAVIOUR",
    "BaseMismatchError",
    "BaseReference",
    "behaviour_config",
    "check_config",
    "config_hash",
    "weight_files",
    "weights_hash",
]
