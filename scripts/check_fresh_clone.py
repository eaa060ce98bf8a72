"""Run the README's and docs/hf.md's shell commands as a new user would: in a fresh clone of the
repository placed outside this repository's folder layout (no ../shared/data beside it, no
$INFTYFORMER_DATA), in a virtual environment of its own, offline except for pip.

    python scripts/check_fresh_clone.py             # what CI runs (.ci/run)
    python scripts/check_fresh_clone.py --list      # only print the commands it would run

The commands are read from the documents, so the check follows them: every shell block of the
README (install, the quick starts, the tests; not the other ways to install torch) and of
docs/hf.md, in order, each block as one bash script. A command that takes long runs with short
settings appended (`SHORTER`, later options win over earlier ones); one that already ran in the
clone (the same conversion in both documents) is not run again; the placeholder DIR is the converted
model's folder. The virtual environment sees the installed packages (--system-site-packages),
so the install lines run as written without downloading what is already there; PYTHONPATH names
the clone's sources, so that no other installed copy of the package is what runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "models/smollm2-135m"  # the folder the documents convert SmolLM2 into
BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)
SHORT_LM = " --steps 1 --eval-every 1 --set eval_batches=1 --set max_docs=1 --set max_tokens=256"
# a long command's prefix -> what is appended to it, or what replaces it whole
SHORTER = {
    "inftyformer train sorting": " --steps 2 --eval-every 2 --set eval_batches=1 "
    "--set test_batches=1",
    "inftyformer train lm": SHORT_LM,
    "python -m pytest -q": " tests/cli/test_cli_start.py tests/data/test_default_corpus.py",
    "python benchmarks/bench_pretrained.py": " --quick",
    "python experiments/retrieval.py": " --lengths 2304 --passages 1",
    "inftyformer ask": " --max-new-tokens 16",
    "python -m inftyformer.integrations.harness": " --max-chars 2000",  # lm_eval reads it whole
}


def blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def documented() -> list[tuple[str, str]]:
    """(where, bash block) in the order they run."""
    readme = [b for i, b in enumerate(blocks(ROOT / "README.md")) if i == 0 or not _alternative(b)]
    hf = blocks(ROOT / "docs" / "hf.md")
    return [("README.md", b) for b in readme] + [("docs/hf.md", b) for b in hf]


def _alternative(block: str) -> bool:
    """A block of other ways to install torch (CPU index, GPU build): the first block already
    installed it, so these are shown, not run."""
    lines = [line.strip() for line in block.splitlines() if line.strip()]
    return bool(lines) and all(line.startswith("pip install torch") for line in lines)


def shorten(block: str, done: set[str]) -> str:
    """`block` with long commands shortened, repeated ones dropped and DIR filled in; lines
    inside a here-document are kept as they are."""
    out, heredoc = [], None
    lines = block.replace("\\\n", " ").splitlines()
    for line in lines:
        if heredoc is not None:
            out.append(line)
            heredoc = None if line.strip() == heredoc else heredoc
            continue
        opened = re.search(r"<<'?(\w+)'?", line)
        if opened:
            heredoc = opened.group(1)
        command = " ".join(re.split(r"\s+#", line, maxsplit=1)[0].split())
        if not command:
            continue
        command = re.sub(r"\bDIR\b", MODEL, command)
        if command in done and not opened:
            continue  # already ran in this clone (e.g. the same conversion)
        done.add(command)
        for prefix, more in SHORTER.items():
            if command == prefix or command.startswith(prefix + " "):
                command += more
                break
        out.append(command)
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--keep", action="store_true", help="keep the clone (its path printed)")
    args = parser.parse_args(argv)
    done: set[str] = set()
    scripts = [(where, shorten(block, done)) for where, block in documented()]
    if args.list:
        for where, script in scripts:
            print(f"# {where}\n{script}")
        return 0
    base = Path(tempfile.mkdtemp(prefix="fresh-clone-"))  # outside the repository's layout
    clone, venv = base / "inftyformer", base / "venv"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFTYFORMER_", "VIRTUAL"))}
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        INFTYFORMER_CACHE=str(base / "cache"),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
    )
    # the clone's code in every Python process, also those of tools installed outside the
    # environment (lm_eval's script runs the system's Python), whatever else is installed
    env["PYTHONPATH"] = str(clone / "src")
    total = time.perf_counter()
    for where, script in scripts:
        print(f"--- {where}:\n{script}", flush=True)
        start = time.perf_counter()
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=clone, env=env)
        seconds = time.perf_counter() - start
        if result.returncode != 0:
            print(f"FAILED ({where}, exit {result.returncode}, {seconds:.0f} s): clone {clone}")
            return 1
        print(f"--- ok ({seconds:.0f} s)", flush=True)
    print(f"every documented command ran in a fresh clone ({time.perf_counter() - total:.0f} s)")
    if args.keep:
        print(f"kept: {base}")
    else:
        subprocess.run(["rm", "-rf", "--", shlex.quote(str(base))], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
