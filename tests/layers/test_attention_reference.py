"""Parity of the long-term memory and continuous attention with straightforward reference
implementations written here, at a fixed initialisation (same parameters, same inputs):

- `NaiveLongTerm`: what the equations say, written plainly — scores s = K q / √d materialised as
  [batch, H, Q, N] (standardised over N by a LayerNorm without affine for `density="normalized"`)
  and fed to the Linear(N, 1) heads, one Gaussian density per basis function, G from an explicit
  inverse, ψ(u) rebuilt every update;
- `initial_attention`: `LongTermAttention.forward` as first committed, the paper's density
  (K = B W^K built and then folded with w_μ, w_σ; the continuous softmax over the whole
  [batch, H, Q, N] at once, plain autograd).

The library folds the heads into B (and, normalized, the scores' variance into a d×d matrix),
fuses the continuous read in blocks with its own backward (core/fused_read.py) and solves for G
in float64; in float64 all three agree to round-off."""

import math

import pytest
import torch
import torch.nn.functional as F

from inftyformer import LongTermAttention, LongTermConfig, LongTermMemory, LongTermState
from inftyformer.core.continuous_softmax import variance_kl
from inftyformer.extensions.densities import SCORE_EPS

CONFIG = dict(dim=24, num_heads=4, num_basis=32, num_samples=24)


class NaiveLongTerm:
    """The straightforward implementation, sharing the parameters of `mem` and `att`."""

    def __init__(self, mem: LongTermMemory, att: LongTermAttention, dtype=torch.float64):
        self.mem, self.att = mem, att
        c = mem.config
        per_width = c.num_basis // len(c.widths)
        centers = torch.linspace(0.0, 1.0, per_width, dtype=torch.float64)
        self.exact = (centers.repeat(len(c.widths)), torch.tensor(c.widths).double())
        self.exact = (self.exact[0], self.exact[1].repeat_interleave(per_width))  # [N], [N]
        # the library reads the signal and attends with float32 copies of the centres and widths
        # (and fits G with the exact ones): round them alike
        self.centers, self.widths = (t.float().to(dtype) for t in self.exact)
        self.dtype = dtype

    def psi(self, t: torch.Tensor, exact: bool = False) -> torch.Tensor:
        c, w = self.exact if exact else (self.centers, self.widths)
        d = t[:, None] - c.to(t.dtype)
        w = w.to(t.dtype)
        return torch.exp(-(d**2) / (2 * w**2)) / (w * math.sqrt(2 * math.pi))  # [T, N]

    def G_inf(self, length: int) -> torch.Tensor:
        """Fᵀ (F Fᵀ + λI)⁻¹ with an explicit inverse, edge padding, real rows only."""
        c, dt = self.mem.config, self.dtype
        m = c.num_samples
        old = c.tau * torch.arange(1, m + 1, dtype=dt) / m
        new = c.tau + (1 - c.tau) * (torch.arange(length, dtype=dt) + 0.5) / length
        t = torch.cat([old, new])
        pad = t.numel() // 2
        offsets = (torch.arange(pad, dtype=dt) + 0.5) * (0.5 / pad)
        F_ = self.psi(torch.cat([-0.5 + offsets, t, 1.0 + offsets]), exact=True).T  # [N, P]
        eye = torch.eye(c.num_basis, dtype=dt)
        G = F_.T @ torch.linalg.inv(F_ @ F_.T + c.ridge_lambda * eye)
        return G[pad : pad + t.numel()]

    def update(self, B_past: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        c = self.mem.config
        x = x * torch.sigmoid(self.mem.gate(x.transpose(1, 2))).transpose(1, 2)
        u = torch.arange(1, c.num_samples + 1, dtype=self.dtype) / c.num_samples
        x_old = self.psi(u) @ B_past.detach()  # [batch, M, e]
        return self.G_inf(x.shape[1]).T @ torch.cat([x_old, x], dim=1)  # [batch, N, e]

    def attend(self, q: torch.Tensor, coefficients: torch.Tensor):
        att, c = self.att, self.att.config
        b, num_q, e = q.shape
        H, d, N = c.num_heads, c.head_dim, c.num_basis
        k = att.key(coefficients).view(b, N, H, d).transpose(1, 2)  # [batch, H, N, d]
        v = att.value(coefficients).view(b, N, H, d).transpose(1, 2)
        qh = q.view(b, num_q, H, d).transpose(1, 2)  # [batch, H, Q, d]
        scores = qh @ k.transpose(-1, -2) / math.sqrt(d)  # [batch, H, Q, N]
        if c.density.kind == "normalized":
            scores = F.layer_norm(scores, (N,), eps=SCORE_EPS)
        mu = torch.sigmoid(att.mu_head(scores)).squeeze(-1)  # [batch, H, Q]
        sigma_sq = F.softplus(att.sigma_head(scores)).squeeze(-1).clamp(min=c.min_sigma_sq)
        var = sigma_sq[..., None] + self.widths**2  # [batch, H, Q, N]
        r = torch.exp(-((mu[..., None] - self.centers) ** 2) / (2 * var)) / torch.sqrt(
            2 * math.pi * var
        )
        z = (r @ v).transpose(1, 2).reshape(b, num_q, e)
        ratio = sigma_sq / c.sigma_0**2
        kl = (0.5 * (ratio - torch.log(ratio) - 1)).mean()
        return att.out(z), kl


def initial_attention(att: LongTermAttention, query: torch.Tensor, state: LongTermState):
    """`LongTermAttention.forward` as first committed. Returns (context, kl)."""
    c = att.config
    batch, num_q, _ = query.shape
    H, d = c.num_heads, c.head_dim
    B = state.coefficients.to(query.dtype)
    q = query.view(batch, num_q, H, d).transpose(1, 2)
    k = att.key(B).view(batch, -1, H, d).transpose(1, 2)
    v = att.value(B).view(batch, -1, H, d).transpose(1, 2)
    w = torch.cat([att.mu_head.weight, att.sigma_head.weight])
    k_heads = torch.einsum("bhnd,mn->bhdm", k, w) / math.sqrt(d)
    logits = torch.matmul(q, k_heads)
    mu = torch.sigmoid(logits[..., 0] + att.mu_head.bias)
    sigma_sq = F.softplus(logits[..., 1] + att.sigma_head.bias).clamp(min=c.min_sigma_sq)
    c_grid = att.basis.center_grid.to(query.dtype)
    w_sq = att.basis.width_grid.to(query.dtype) ** 2
    var = sigma_sq.unsqueeze(-1) + w_sq
    coef = (-0.5 / var).unsqueeze(-1)
    log_norm = (-0.5 * torch.log(2.0 * math.pi * var)).unsqueeze(-1)
    dist_sq = ((mu.unsqueeze(-1) - c_grid) ** 2).unsqueeze(-2)
    r = torch.exp(torch.addcmul(log_norm, coef, dist_sq)).flatten(-2)  # [batch, H, Q, N]
    z = torch.matmul(r, v).transpose(1, 2).reshape(batch, num_q, H * d)
    filled = (~state.empty).to(query.dtype)
    context = att.out(z) * filled[:, None, None]
    kl_rows = variance_kl(sigma_sq, c.sigma_0).mean(dim=(1, 2))
    kl = (kl_rows * filled).sum() / filled.sum().clamp(min=1.0)
    return context, kl


def _setup(dtype, batch=2, length=40, seed=0, **settings):
    torch.manual_seed(seed)  # fixed initialisation, shared by every implementation
    cfg = LongTermConfig(**{**CONFIG, **settings})
    mem, att = LongTermMemory(cfg).to(dtype), LongTermAttention(cfg).to(dtype)
    g = torch.Generator().manual_seed(seed + 1)
    e = cfg.dim
    state = mem.update(
        mem.init_state(batch, dtype=dtype), torch.randn(batch, length, e, generator=g, dtype=dtype)
    ).detach()
    x = torch.randn(batch, length, e, generator=g, dtype=dtype)
    q = torch.randn(batch, length, e, generator=g, dtype=dtype)
    return mem, att, state, x, q


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("density", ["paper", "normalized"])
@pytest.mark.parametrize("sigma_init", [None, 0.2])
def test_attention_matches_the_naive_form(density, sigma_init):
    mem, att, state, _, q = _setup(torch.float64, density=density, sigma_init=sigma_init)
    naive = NaiveLongTerm(mem, att)
    out = att(q, state)
    context, kl = naive.attend(q, state.coefficients)
    assert _rel(out.context, context) < 1e-12
    assert out.kl.item() == pytest.approx(kl.item(), rel=1e-12)


def test_normalized_gradients_match_the_naive_form():
    """Every gradient of the folded standardisation (the d×d second moment) equals autograd
    through the materialised LayerNorm over the N scores."""
    mem, att, state, _, q = _setup(torch.float64, density="normalized")
    q.requires_grad_()
    coefficients = state.coefficients.clone().requires_grad_()
    grads = []
    for variant in ("library", "naive"):
        att.zero_grad(set_to_none=True)
        q.grad = coefficients.grad = None
        s = LongTermState(coefficients, state.attention_mass, state.observed, state.empty)
        if variant == "library":
            out = att(q, s)
            context, kl = out.context, out.kl
        else:
            context, kl = NaiveLongTerm(mem, att).attend(q, coefficients)
        (context.square().sum() + kl).backward()
        got = {"q": q.grad.clone(), "B": coefficients.grad.clone()}
        got.update({n: p.grad.clone() for n, p in att.named_parameters()})
        grads.append(got)
    for key in grads[0]:
        assert _rel(grads[0][key], grads[1][key]) < 1e-10, key


def test_update_matches_the_naive_form():
    mem, att, state, x, _ = _setup(torch.float64)
    naive = NaiveLongTerm(mem, att)
    got = mem.update(state, x).coefficients
    want = naive.update(state.coefficients, x)
    # explicit inverse vs solve, both float64: they differ by about cond(F Fᵀ + λI) · 1e-16
    assert _rel(got, want) < 1e-6


@pytest.mark.parametrize(
    "dtype, tol", [(torch.float64, 1e-12), (torch.float32, 5e-6)], ids=["float64", "float32"]
)
def test_update_and_attention_match_the_initial_version(dtype, tol):
    """Context, KL and every gradient (CNN gate included) of one update + attention step."""
    mem, att, state, x, q = _setup(dtype, density="paper")
    q.requires_grad_()
    results = []
    for variant in ("library", "initial"):
        for module in (mem, att):
            module.zero_grad(set_to_none=True)
        q.grad = None
        new_state = mem.update(state, x)
        if variant == "library":
            out = att(q, new_state)
            context, kl = out.context, out.kl
        else:
            context, kl = initial_attention(att, q, new_state)
        (context.sum() + kl).backward()
        got = {"context": context.detach(), "kl": kl.detach(), "q.grad": q.grad.clone()}
        for prefix, module in (("mem.", mem), ("att.", att)):
            for name, p in module.named_parameters():
                got[prefix + name] = p.grad.clone()
        results.append(got)
    library, initial = results
    assert library.keys() == initial.keys()
    for key in library:
        assert _rel(library[key], initial[key]) < tol, key
