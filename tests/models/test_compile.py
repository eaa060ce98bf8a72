"""`torch.compile(model)` gives the eager outputs for the four model types: training steps (loss
and every gradient) and streaming inference, the memory passed in and returned explicitly.

Slow: compiling takes tens of seconds per model type on a CPU. The graph breaks (data-dependent
branches of the memories and the argument checks) are counted and explained by
`benchmarks/bench_models.py`; here only the numbers are compared.

With a warm AOTAutograd cache, torch 2.13 fails to rebuild a graph output that is a view of an
intermediate when it loads a cached graph ("shape '[93…, 28…, 32]' is invalid for input of size
…", as in pytorch/pytorch#185630 and #174299); a cold cache is fine. The test turns that cache off
(`torch._functorch.config.enable_autograd_cache`, or TORCHINDUCTOR_AUTOGRAD_CACHE=0); inductor's
own FX graph cache stays on."""

import pytest
import torch
import torch._functorch.config as functorch_config
from tiny_models import MODEL_TYPES, V, tiny

from inftyformer import MemoryLM

pytestmark = pytest.mark.slow

TOL = 1e-5  # max |compiled − eager| / max |eager|: float32 round-off of reordered kernels


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    if b.numel() == 0:  # e.g. the vanilla transformer's empty short-term memory
        return 0.0
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item()


@pytest.fixture(autouse=True)
def _no_aot_autograd_cache():
    with functorch_config.patch(enable_autograd_cache=False):
        yield


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_compiled_model_matches_eager(model_type):
    torch.manual_seed(0)
    model = MemoryLM(tiny(model_type))
    compiled = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    segments = [torch.randint(0, V, (2, 8), generator=g) for _ in range(3)]

    eager_state = compiled_state = None
    for tokens in segments:  # training: loss and gradients of every parameter
        results = []
        for fn, state in ((model, eager_state), (compiled, compiled_state)):
            model.zero_grad(set_to_none=True)
            out = fn(tokens, state, targets=tokens)
            out.loss.backward()
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            results.append((out, grads))
        (eager, eager_grads), (comp, comp_grads) = results
        assert comp.loss.item() == pytest.approx(eager.loss.item(), rel=TOL)
        for name in eager_grads:
            assert _rel(comp_grads[name], eager_grads[name]) < TOL, name
        eager_state, compiled_state = eager.state, comp.state

    model.eval()
    with torch.no_grad():  # streaming inference from the trained-on state
        for tokens in segments:
            eager = model(tokens, eager_state)
            comp = compiled(tokens, compiled_state)
            assert _rel(comp.logits, eager.logits) < TOL
            eager_state, compiled_state = eager.state, comp.state
            for layer_e, layer_c in zip(eager_state.layers, compiled_state.layers, strict=True):
                for (name, te), (_, tc) in zip(
                    layer_e.tensors().items(), layer_c.tensors().items(), strict=True
                ):
                    if te.is_floating_point():
                        assert _rel(tc, te) < TOL, name
                    else:
                        assert torch.equal(tc, te), name
