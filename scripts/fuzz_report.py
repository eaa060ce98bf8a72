"""Run the full fuzz tests (tests/fuzz, the `slow` copies: several thousand examples per public
function) and record what they did: docs/robustness/fuzz.json (per test: examples, failures, the
share of inputs accepted and refused by error class) and the table in docs/robustness.md,
rendered from that JSON between the `fuzz-table` markers.

    python scripts/fuzz_report.py                 # 3000 examples per function, seed 20261130
    python scripts/fuzz_report.py --examples 500  # a quicker look
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
JSON_PATH = ROOT / "docs" / "robustness" / "fuzz.json"
DOC_PATH = ROOT / "docs" / "robustness.md"
BEGIN, END = "<!-- fuzz-table:begin -->", "<!-- fuzz-table:end -->"

# what each fuzz test drives (the public function and what is fuzzed)
TARGETS = {
    "test_fuzz_basis_constructor_many": "`GaussianBasis(N, widths)`",
    "test_fuzz_basis_forward_many": "`GaussianBasis.forward(t)`",
    "test_fuzz_continuous_softmax_many": "`continuous_softmax(mu, sigma_sq, basis)`",
    "test_fuzz_variance_kl_many": "`variance_kl(sigma_sq, sigma_0)`",
    "test_fuzz_ridge_design_matrix_many": "`ridge_design_matrix(basis, positions, λ, padding)`",
    "test_fuzz_fit_coefficients_many": "`fit_coefficients(x, G)`",
    "test_fuzz_evaluate_signal_many": "`evaluate_signal(B, basis, t)`",
    "test_fuzz_positions_many": "`segment_positions`, `edge_padding_positions`",
    "test_fuzz_long_term_update_many": "`LongTermMemory.update` (x, generator, state fields)",
    "test_fuzz_long_term_observe_many": "`LongTermMemory.observe` (μ, σ², state fields)",
    "test_fuzz_long_term_sample_positions_many": "`LongTermMemory.sample_positions` (state)",
    "test_fuzz_long_term_attention_many": "`LongTermAttention.attend` (query, state fields)",
    "test_fuzz_memory_lm_inputs_many": "`MemoryLM.forward` (tokens, targets, reset, state)",
    "test_fuzz_memory_lm_state_fields_many": "`MemoryLM.forward` (every state field, 4 models)",
    "test_fuzz_every_state_a_model_makes_passes_its_check_many": (
        "`MemoryLM` streams (call lengths, resets): own states pass `check_state`"
    ),
    "test_fuzz_load_state_corrupted_files_many": "`load_state` (truncated, flipped, metadata)",
    "test_fuzz_cli_set_items_many": "`--set KEY=VALUE` items → configs",
    "test_fuzz_hf_settings_many": "`add_long_term_memory(base, **settings)` (pretrained adapter)",
    "test_fuzz_hf_forward_many": (
        "`InftyformerForCausalLM.forward` (input_ids, labels, attention_mask, reset, memory)"
    ),
}


def parse(output: str) -> dict[str, dict]:
    """Per test: passing/failing/invalid examples and the events (accepted, refused (Error))."""
    tests: dict[str, dict] = {}
    current = None
    for line in output.splitlines():
        head = re.match(r"tests/fuzz/(\S+)::(\S+):$", line.strip())
        if head:
            current = {"file": head.group(1), "events": {}}
            tests[head.group(2)] = current
            continue
        if current is None:
            continue
        counts = re.search(r"(\d+) passing examples, (\d+) failing examples, (\d+) invalid", line)
        if counts:
            names = ("passing", "failing", "invalid")
            current.update(zip(names, map(int, counts.groups()), strict=True))
        event = re.match(r"\s*\* ([\d.]+)%, (.+)$", line)
        if event:
            current["events"][event.group(2)] = float(event.group(1))
    return tests


def render(data: dict) -> str:
    rows = [
        f"Seed {data['seed']}, {data['examples']} examples per function, torch "
        f"{data['torch']}, {data['wall_minutes']:.1f} min on {data['cpus']} CPU core(s); "
        f"pytest exit code {data['exit_code']} (`python scripts/fuzz_report.py`).",
        "",
        "| function (what is fuzzed) | examples | failing | accepted | refused: ValueError "
        "| TypeError | NonFiniteError |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, test in data["tests"].items():
        ev = test.get("events", {})

        def share(key: str, ev: dict = ev) -> str:
            return f"{ev[key]:.0f}%" if key in ev else "–"

        rows.append(
            f"| {TARGETS.get(name, name)} | {test.get('passing', 0)} | {test.get('failing', 0)} "
            f"| {share('accepted')} | {share('refused (ValueError)')} "
            f"| {share('refused (TypeError)')} | {share('refused (NonFiniteError)')} |"
        )
    rows.append("")
    rows.append(
        "Shares are Hypothesis' event statistics (of the examples it ran, draws it discarded "
        "included, so a row need not sum to 100%; two functions per example for the positions). "
        "Every accepted input's result was checked (shape, dtype, finiteness, the closed form "
        "or a float64 reference where there is one); every refused one had to raise "
        "TypeError/ValueError naming an invalid argument. NonFiniteError is the ValueError for "
        "NaN, inf and out-of-range magnitudes."
    )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20261130)
    args = parser.parse_args()
    env = {**os.environ, "INFTYFORMER_FUZZ_EXAMPLES": str(args.examples)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "slow", "tests/fuzz", "-p",
           "no:cacheprovider", "--hypothesis-show-statistics",
           f"--hypothesis-seed={args.seed}"]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    minutes = (time.perf_counter() - start) / 60
    import torch

    data = {
        "seed": args.seed,
        "examples": args.examples,
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "wall_minutes": minutes,
        "exit_code": proc.returncode,
        "date": time.strftime("%Y-%m-%d"),
        "tests": parse(proc.stdout),
    }
    JSON_PATH.parent.mkdir(parents=True, exist_ok=True)
    JSON_PATH.write_text(json.dumps(data, indent=1) + "\n")
    doc = DOC_PATH.read_text()
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOC_PATH.write_text(f"{head}{BEGIN}\n{render(data)}\n{END}{tail}")
    print(proc.stdout[-2000:])
    print(f"wrote {JSON_PATH} and the table in {DOC_PATH}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
