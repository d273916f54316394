"""Agreement with the reference implementation, the entmax package (1.3), to 1e-5."""

import pytest
import torch

from fairseq_entmax.normalizers import alpha_entmax, entmax15, sparsemax

try:
    import entmax
except ImportError:
    entmax = None
pytestmark = pytest.mark.requires(entmax is not None, "the entmax package (test extra, `make setup`) is not installed")

SHAPES = [(5, 7), (4, 3, 33), (2, 128)]


def _inputs(shape, dtype, seed, scale=2.0):
    torch.manual_seed(seed)
    scores = (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype).requires_grad_()
    upstream = torch.randn(*shape, dtype=torch.float64).to(dtype)
    return scores, upstream


def _value_and_grad(fn, scores, upstream, *extra):
    inputs = [scores.detach().clone().requires_grad_()] + [e.detach().clone().requires_grad_() for e in extra]
    out = fn(*inputs)
    grads = torch.autograd.grad(out, inputs, upstream)
    return (out.detach(),) + grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "ours, theirs",
    [(sparsemax, lambda x: entmax.sparsemax(x, dim=-1)), (entmax15, lambda x: entmax.entmax15(x, dim=-1))],
    ids=["sparsemax", "entmax15"],
)
def test_exact_maps_agree_with_entmax(ours, theirs, shape, dtype):
    for seed in range(3):
        scores, upstream = _inputs(shape, dtype, seed)
        for mine, reference in zip(_value_and_grad(ours, scores, upstream), _value_and_grad(theirs, scores, upstream)):
            torch.testing.assert_close(mine, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_alpha_entmax_and_alpha_gradient_agree_with_entmax_bisect(shape, dtype):
    """Values, score gradients and alpha gradients (alpha per row in [1.1, 2.5])."""
    for seed in range(3):
        scores, upstream = _inputs(shape, dtype, seed)
        alpha_shape = shape[:-1] + (1,)
        alpha = (1.1 + 1.4 * torch.rand(alpha_shape, dtype=torch.float64)).to(dtype)
        mine = _value_and_grad(lambda x, a: alpha_entmax(x, a), scores, upstream, alpha)
        # entmax_bisect in float64 with many iterations is the reference at any dtype.
        reference = _value_and_grad(
            lambda x, a: entmax.entmax_bisect(x, a, dim=-1, n_iter=100),
            scores.double(),
            upstream.double(),
            alpha.double(),
        )
        for ours, theirs in zip(mine, reference):
            torch.testing.assert_close(ours.double(), theirs, atol=1e-5, rtol=1e-5)


def test_learned_alpha_per_head_gradient_agrees_with_entmax_bisect():
    """alpha = 1 + sigmoid(a) per head broadcast over (batch, heads, queries, keys)."""
    torch.manual_seed(7)
    scores = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    upstream = torch.randn(2, 4, 5, 16, dtype=torch.float64)
    grads = []
    for fn in (alpha_entmax, lambda x, a: entmax.entmax_bisect(x, a, -1, 100)):
        logits = torch.tensor([-2.0, -0.5, 0.5, 2.0], dtype=torch.float64, requires_grad=True)
        alpha = (1 + torch.sigmoid(logits)).view(1, 4, 1, 1)
        (fn(scores, alpha) * upstream).sum().backward()
        grads.append(logits.grad)
    torch.testing.assert_close(grads[0], grads[1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_float32_attention_rows_agree_with_float64_reference():
    """Many float32 attention rows (regression: rare rows where rounding stalled the
    threshold search): sparsemax, entmax15 and alpha_entmax stay within 1e-6 of entmax's
    float64 results."""
    torch.manual_seed(0)
    scores = torch.randn(128, 128, 128)  # holds such a row for entmax15 (at [49, 33])
    double = scores.double()
    torch.testing.assert_close(sparsemax(scores).double(), entmax.sparsemax(double, -1), atol=1e-6, rtol=0)
    torch.testing.assert_close(entmax15(scores).double(), entmax.entmax15(double, -1), atol=1e-6, rtol=0)
    alpha = torch.linspace(1.05, 2.0, 4).view(4, 1, 1)
    torch.testing.assert_close(
        alpha_entmax(scores[:4], alpha).double(),
        entmax.entmax_bisect(double[:4], alpha.double(), -1, n_iter=60),
        atol=1e-6,
        rtol=0,
    )
