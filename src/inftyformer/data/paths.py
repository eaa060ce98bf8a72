"""Where the shared, read-only data lives (``../shared/data`` next to the repository), and the
split names every data set uses.

The data is never copied into the project: every loader takes a directory, and these helpers find
the default one. Order of precedence:

1. the environment variable ``INFTYFORMER_DATA`` (if it is set, it is the only candidate: an
   explicit choice is never silently replaced by a fallback);
2. ``<repo root>/../shared/data``, found relative to this source file;
3. ``<current directory>/../shared/data``.

Where none exists, the text-reading tasks fall back on the corpus the package carries
(:data:`EMBEDDED_SOURCE`: Jane Austen's six novels, ``austen/PROVENANCE.md``) and say so.
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV_VAR = "INFTYFORMER_DATA"
SPLITS = ("train", "valid", "test")  # the split names of every data set here
# the corpus the package carries, named as a data source (`--data-dir builtin:austen`)
EMBEDDED_SOURCE = "builtin:austen"
EMBEDDED_CORPUS = Path(__file__).resolve().parent / "austen"

# src/inftyformer/data/paths.py -> parents[3] is the repository root.
_REPO_ROOT = Path(__file__).resolve().parents[3]


def _candidates() -> list[Path]:
    env = os.environ.get(DATA_ENV_VAR)
    if env:
        return [Path(env).expanduser()]
    candidates = [_REPO_ROOT.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    # the two coincide when the command runs from the repository root: name each place once
    unique: list[Path] = []
    for candidate in candidates:
        if candidate.resolve() not in [seen.resolve() for seen in unique]:
            unique.append(candidate)
    return unique


def default_data_dir() -> Path | None:
    """The first existing data directory (see module docstring), or None when there is none."""
    for candidate in _candidates():
        if candidate.is_dir():
            return candidate.resolve()
    return None


def resolve_data_dir(path: str | Path | None = None) -> Path:
    """`path` if given (must be an existing directory), else :func:`default_data_dir`.

    Raises FileNotFoundError naming the path(s) that were tried.
    """
    if path is not None:
        if not isinstance(path, (str, Path)):
            raise TypeError(f"data_dir must be a str, Path or None, got {type(path).__name__}")
        resolved = Path(path).expanduser()
        if not resolved.is_dir():
            raise FileNotFoundError(f"data directory not found: {resolved}")
        return resolved.resolve()
    found = default_data_dir()
    if found is None:
        env = os.environ.get(DATA_ENV_VAR)
        if env:
            raise FileNotFoundError(
                f"${DATA_ENV_VAR} is {env}, which is not a directory: set it to the folder that "
                "holds the data, or give the data with --data-dir DIR"
            )
        raise FileNotFoundError(
            f"no data directory found (looked for {looked_for()}): give the data with --data-dir "
            f"DIR or set ${DATA_ENV_VAR} to the folder that holds it"
        )
    return found


def looked_for() -> str:
    """The places a data directory was looked for, for messages."""
    return " or ".join(str(c.resolve()) for c in _candidates())


def training_source(data_dir: str | Path | None) -> str | Path:
    """Where a task's text comes from: `data_dir` when given (a directory, a file, or a named
    source such as ``hf:NAME`` or :data:`EMBEDDED_SOURCE`, returned as is), else the default data
    directory, else (no data directory, and ${DATA_ENV_VAR} not set) the embedded corpus,
    :data:`EMBEDDED_SOURCE`."""
    if data_dir is not None:
        return data_dir if ":" in str(data_dir) else resolve_data_dir(data_dir)
    if default_data_dir() is None and not os.environ.get(DATA_ENV_VAR):
        return EMBEDDED_SOURCE
    return resolve_data_dir(None)


def embedded_fallback_note(data_dir: str | Path | None) -> str | None:
    """The line a command prints when `training_source(data_dir)` falls back on the embedded
    corpus; None when it does not."""
    if training_source(data_dir) != EMBEDDED_SOURCE or data_dir is not None:
        return None
    return (
        f"no data directory found (looked for {looked_for()}): training on the embedded corpus "
        f"{EMBEDDED_SOURCE}, Jane Austen's six novels (3.9 MB). For real books give --data-dir "
        f"DIR (.txt, parquet or arrow files) or --data-dir hf:NAME (a Hugging Face dataset)"
    )


def check_split(split: object) -> str:
    """`split` if it is one of :data:`SPLITS`, else a TypeError/ValueError naming it."""
    if not isinstance(split, str):
        raise TypeError(f"split must be a str, got {type(split).__name__}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    return split
