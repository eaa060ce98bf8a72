#!/usr/bin/env bash
# A virtualenv of its own for NVIDIA's kvpress, the KV-cache presses that experiments/ruler_kvpress.py
# runs as peer rows of docs/results/ruler.md. kvpress pins transformers below 5.3 while inftyformer needs a
# newer one, so kvpress is never a dependency of the package: it lives in this venv alone.
#
#     bash scripts/kvpress_env.sh [VENV]          # default VENV: .venv-kvpress in the repo root
#
# torch: the CPU build, from PyTorch's CPU index where it answers, else `torch==$TORCH` as the
# README's set-up takes it (set TORCH to choose another version).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$root/.venv-kvpress}"
torch_version="${TORCH:-2.13.0}"
kvpress_version="${KVPRESS:-0.5.5}"
cpu_index="https://download.pytorch.org/whl/cpu"

python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if "$venv/bin/python" -c "import urllib.request as u; u.urlopen('$cpu_index/', timeout=10)" \
    2>/dev/null; then
  "${pip[@]}" "torch==$torch_version" --index-url "$cpu_index"
else
  echo "PyTorch's CPU index does not answer: torch==$torch_version from the default index"
  "${pip[@]}" "torch==$torch_version"
fi
# transformers below 5.3 as kvpress asks; 5.x reads the base's tokenizer files as saved by 5.x
"${pip[@]}" "kvpress==$kvpress_version" "transformers>=5,<5.3"
"$venv/bin/python" -c "
import importlib.metadata as m
print(*(f'{p} {m.version(p)}' for p in ('kvpress', 'transformers', 'torch')), sep=', ')"
echo "run the presses with: $venv/bin/python experiments/ruler_kvpress.py --help"
