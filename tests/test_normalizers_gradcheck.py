"""float64 gradcheck of every normalizer's hand-written backward, with masked entries; the
alpha gradient close to alpha = 1 against differences of the independent reference. Each
on the early-exit path with and without alpha_entmax's selected entries."""

import numpy as np
import pytest
import torch

from fairseq_entmax.normalizers import alpha_entmax, entmax15, softmax, sparsemax, topk_softmax
from normalizer_paths import PATHS
from normalizer_references import alpha_entmax_reference


@pytest.fixture(autouse=True, params=["early_exit", "early_exit_selected"])
def path(request):
    with PATHS[request.param]():
        yield


def _scores(seed, shape=(3, 4, 7)):
    torch.manual_seed(seed)
    scores = torch.randn(*shape, dtype=torch.float64) * 2
    scores[0, 1, [2, 5]] = float("-inf")  # masked keys
    scores[1, 2, 4:] = float("-inf")
    scores[2, 3, :] = float("-inf")  # a fully masked row
    return scores.requires_grad_()


@pytest.mark.parametrize(
    "fn",
    [
        softmax,
        sparsemax,
        entmax15,
        lambda x: topk_softmax(x, 3),
        lambda x: alpha_entmax(x, 1.25),
        lambda x: alpha_entmax(x, 1.75),
        lambda x: alpha_entmax(x, 3.0),
    ],
    ids=["softmax", "sparsemax", "entmax15", "topk3", "alpha1.25", "alpha1.75", "alpha3"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_gradcheck_scores(fn, seed):
    assert torch.autograd.gradcheck(fn, (_scores(seed),))


@pytest.mark.parametrize("dim", [-1, 1])
def test_gradcheck_scores_and_alpha_per_head(dim):
    scores = _scores(2)
    shape = [1, 1, 1]
    shape[dim] = 1
    shape[0] = 3  # one alpha per "head" (first dim), shared along the other dims
    alpha = torch.tensor([1.1, 1.6, 2.5], dtype=torch.float64).view(shape).requires_grad_()
    assert torch.autograd.gradcheck(lambda s, a: alpha_entmax(s, a, dim), (scores, alpha))


def test_gradcheck_alpha_per_row_including_two():
    scores = _scores(3)
    alpha = torch.linspace(1.05, 2.0, 12, dtype=torch.float64).view(3, 4, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda s, a: alpha_entmax(s, a), (scores, alpha))


def test_alpha_gradient_at_one_matches_one_sided_difference():
    """alpha = 1 (softmax) uses the limit of Proposition 1; alpha < 1 is not allowed, so
    the check is against one-sided finite differences, extrapolated (Richardson) to
    second order."""
    torch.manual_seed(4)
    scores = torch.randn(6, 8, dtype=torch.float64)
    scores[0, :3] = float("-inf")
    upstream = torch.randn(6, 8, dtype=torch.float64)
    alpha = torch.ones(6, 1, dtype=torch.float64, requires_grad=True)
    (alpha_entmax(scores, alpha) * upstream).sum().backward()

    def loss(a):
        with torch.no_grad():
            return (alpha_entmax(scores, torch.full((6, 1), a, dtype=torch.float64)) * upstream).sum(-1)

    h = 1e-3
    one_step = (loss(1 + h) - loss(1.0)) / h
    two_steps = (loss(1 + 2 * h) - loss(1.0)) / (2 * h)
    torch.testing.assert_close(alpha.grad.view(-1), 2 * one_step - two_steps, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "am1, float32_rtol",
    [
        (2.0**-13, 1e-3),
        (2.0**-10, 1e-3),
        (2.0**-8, 1e-3),  # the near-one form
        (2.0**-7, 1e-2),  # the general form, just above
    ],
)
def test_alpha_gradient_close_to_one_matches_differences_of_the_reference(am1, float32_rtol):
    """Close to alpha = 1 the general form of the alpha gradient divides a cancelling
    difference by (alpha - 1)^2 (in float32 off by 11x the gradient at alpha - 1 = 1e-4);
    below 5e-3 the gradient has its own form. Against central differences of the independent
    float64 bisection reference (alpha exactly representable in float32)."""
    torch.manual_seed(5)
    scores = torch.randn(16, 40, dtype=torch.float64) * 3
    scores[:3, :8] = float("-inf")
    upstream = torch.randn(16, 40, dtype=torch.float64)

    def loss(alpha):
        p = np.stack([alpha_entmax_reference(row, alpha) for row in scores.numpy()])
        return (torch.from_numpy(p) * upstream).sum(-1)

    h = am1 / 100
    expected = (loss(1 + am1 + h) - loss(1 + am1 - h)) / (2 * h)
    for dtype, rtol in ((torch.float64, 1e-6), (torch.float32, float32_rtol)):
        alpha = torch.full((16, 1), 1 + am1, dtype=dtype, requires_grad=True)
        (alpha_entmax(scores.to(dtype), alpha) * upstream.to(dtype)).sum().backward()
        error = (alpha.grad.view(-1).double() - expected).abs().max()
        assert error <= rtol * expected.abs().max(), (dtype, error)
