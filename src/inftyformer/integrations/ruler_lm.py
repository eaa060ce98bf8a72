"""lm-evaluation-harness (`lm_eval` 0.4.x) model "inftyformer-retrieval": a pretrained rotary
causal LM with training-free retrieval of its exact past (`retrieval.py`) answering the
harness's generation requests, such as RULER's (`experiments/ruler.py`, `docs/results/ruler.md`):

    python -m inftyformer.integrations.ruler_lm run --model inftyformer-retrieval \\
        --model_args pretrained=MODEL_DIR,preset=retrieval --tasks niah_single_1 \\
        --metadata '{"max_seq_lengths": [8192]}' --limit 5

(lm_eval's own command line, with this model registered first; in Python, import this module
and call `lm_eval.simple_evaluate(model="inftyformer-retrieval", ...)`.) RULER's essay-haystack
needles offline, on the package's novels (`integrations/ruler_haystack.py`): add
`--include_path "$(python -m inftyformer.integrations.ruler_haystack)"
--tasks niah_multikey_1_books`.

model_args: `pretrained` (a model folder with its tokenizer), `preset` (a preset of the
retrieval kind: retrieval, streaming, window; `inftyformer presets`), any `RetrievalConfig`
setting on top of it (`block_size=64,window=512`), `tokenizer` (default: `pretrained`),
`dtype` (float32) and `batch_size`.

Each prompt is read whole, however long (past the base's positions too: the memory streams it in
calls of `segment_len` tokens, keeping only the last call's logits), the last call choosing its
blocks with its own queries (`reselect`, as `RetrievalLM.generate`); then one call per new token,
greedy, until a stop string of the request (cut off, as lm_eval's `hf` model does), the
tokenizer's end-of-sequence token or `max_gen_toks`. Prompts of one token length and one set of
generation settings go together, `batch_size` at a time.
"""

from __future__ import annotations

import json
from pathlib import Path

# lm_eval's own models listed first: it lists them only into an empty registry
import lm_eval.models  # noqa: F401
import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from ..retrieval.config import RetrievalConfig
from ..retrieval.model import RetrievalLM

NAME = "inftyformer-retrieval"
SETTINGS = RetrievalConfig.setting_names()
OWN = ("pretrained", "preset", "tokenizer", "dtype", "batch_size", "max_batch_size", "device")
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_MAX_GEN_TOKS = 256  # lm_eval's default where a task names none


def cut_at_stops(text: str, stops: list[str]) -> str:
    """`text` up to the first occurrence of any stop string."""
    for stop in stops:
        if stop:
            text = text.split(stop, 1)[0]
    return text


def pick_device(device: str | None) -> torch.device:
    """`device`, as lm_eval's hf model takes it: none, or a CUDA device where there is none
    (lm_eval's command line asks for cuda:0 unless told), is CUDA where there is one, else the
    CPU."""
    if device is None or (str(device).startswith("cuda") and not torch.cuda.is_available()):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def generation_settings(gen_kwargs: dict) -> tuple[list[str], int]:
    """(stop strings, max new tokens) of a request; sampling is refused (greedy only)."""
    if not isinstance(gen_kwargs, dict):
        raise ValueError(f"gen_kwargs must be a dict, got {type(gen_kwargs).__name__}")
    settings = dict(gen_kwargs)
    until = settings.pop("until", None)
    stops = [until] if isinstance(until, str) else until
    if stops is None:
        stops = []
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) for s in stops):
        raise ValueError(f"until must be a string or a list of strings, got {until!r}")
    count = next(
        (settings[k] for k in ("max_gen_toks", "max_new_tokens") if settings.get(k) is not None),
        DEFAULT_MAX_GEN_TOKS,
    )
    temperature = settings.get("temperature") or 0.0
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number, got {temperature!r}")
    if settings.get("do_sample") or temperature > 0:
        raise ValueError(f"{NAME} generates greedily: do_sample must be false, temperature 0")
    whole = isinstance(count, int) or (isinstance(count, float) and count.is_integer())
    if isinstance(count, bool) or not whole or count < 1:
        raise ValueError(f"max_gen_toks must be a positive int, got {count!r}")
    return list(stops), int(count)


def positive_batch_size(batch_size: object) -> int:
    """lm_eval's `batch_size` (None: 1; an int, or its digits as text), refused unless a whole
    number ≥ 1 ("auto" and 2.5 too: nothing is rounded)."""
    value = 1 if batch_size is None else batch_size
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{NAME}: batch_size must be a positive int, got {batch_size!r}")
    return value


@register_model(NAME)
class RetrievalHarnessLM(LM):
    """`RetrievalLM` behind lm_eval's `LM` interface (module doc)."""

    def __init__(
        self,
        pretrained: str | None = None,
        preset: str = "retrieval",
        tokenizer: str | None = None,
        dtype: str = "float32",
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,
        device: str | None = None,
        **settings,
    ):
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ValueError(
                f"{NAME}: unknown model_args {', '.join(unknown)}; known: "
                f"{', '.join(OWN + SETTINGS)}"
            )
        if pretrained is None or not (Path(str(pretrained)) / "config.json").is_file():
            raise ValueError(
                f"{NAME}: pretrained= must name a model folder (config.json and weights, its "
                f"tokenizer beside them), got {pretrained!r}"
            )
        if dtype not in DTYPES:
            raise ValueError(f"{NAME}: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
        self.batch_size = positive_batch_size(batch_size)
        # the preset and settings checked before any weight is read
        config = RetrievalConfig.from_preset(preset, **settings)
        base = AutoModelForCausalLM.from_pretrained(str(pretrained), dtype=getattr(torch, dtype))
        self._device = pick_device(device)
        self.model = RetrievalLM(base.to(self.device), config).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or pretrained))
        self.eos_id = self.tokenizer.eos_token_id

    def encode(self, text: str) -> list[int]:
        """The prompt's tokens, as lm_eval's `hf` model takes them (no special tokens added)."""
        return self.tokenizer(text, add_special_tokens=False).input_ids

    # ------------------------------------------------------------------ lm_eval's requests
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each request's (context, gen_kwargs) answered: the greedy continuation (module doc)."""
        prompts = [self.encode(r.args[0]) for r in requests]
        settings = [generation_settings(r.args[1]) for r in requests]
        for i, ids in enumerate(prompts):
            if not ids:
                raise ValueError(f"request {i}: the prompt is empty (no token to continue)")
        groups: dict[tuple, list[int]] = {}
        for i, (ids, (stops, count)) in enumerate(zip(prompts, settings, strict=True)):
            groups.setdefault((len(ids), json.dumps(stops), count), []).append(i)
        out: list[str | None] = [None] * len(requests)
        bar = tqdm(total=len(requests), disable=disable_tqdm, desc=f"{NAME} generate_until")
        for members in groups.values():
            for start in range(0, len(members), self.batch_size):
                rows = members[start : start + self.batch_size]
                stops, count = settings[rows[0]]
                ids = torch.tensor([prompts[i] for i in rows], device=self.device)
                for i, text in zip(rows, self.continue_greedily(ids, stops, count), strict=True):
                    out[i] = text
                    self.cache_hook.add_partial("generate_until", requests[i].args, text)
                bar.update(len(rows))
        bar.close()
        return out

    @torch.no_grad()
    def continue_greedily(self, ids: torch.Tensor, stops: list[str], count: int) -> list[str]:
        """The greedy continuations of the prompts `ids` [b, T], each up to its first stop
        string or end-of-sequence token, at most `count` tokens."""
        model = self.model
        keep = model.config.answer_choice == "question"  # the answer reads the question's
        state = model.init_state(ids.shape[0])
        try:  # the prompt streamed, its last call choosing first, the last logits kept
            out = model(ids, state, reselect=True, logits_to_keep=1)
            logits, state = out.logits[:, -1], out.state
            written = [[] for _ in range(ids.shape[0])]
            done = [False] * ids.shape[0]
            for step in range(count):
                token = logits.argmax(-1, keepdim=True)  # [b, 1]
                for row, t in enumerate(token[:, 0].tolist()):
                    if done[row]:
                        continue
                    if t == self.eos_id:
                        done[row] = True
                        continue
                    written[row].append(t)
                    text = self.tokenizer.decode(written[row])
                    done[row] = any(s and s in text for s in stops)
                if all(done) or step == count - 1:
                    break
                out = model(token, state, keep_choice=keep)
                logits, state = out.logits[:, -1], out.state
        finally:
            state.store.close()
        return [cut_at_stops(self.tokenizer.decode(w), stops) for w in written]

    def loglikelihood(self, requests, disable_tqdm: bool = False):
        raise NotImplementedError(
            f"{NAME} answers generation requests only (generate_until: RULER and other "
            "generated-answer tasks); for log-likelihood tasks evaluate a saved memory model "
            "with lm_eval's hf model (python -m inftyformer.integrations.harness)"
        )

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False):
        self.loglikelihood(requests)


def main() -> None:
    """lm_eval's command line with this model registered (module doc)."""
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()


__all__ = ["NAME", "RetrievalHarnessLM", "cut_at_stops", "generation_settings", "pick_device"]
