"""torch.compile(fullgraph=True, dynamic=True) captures every public normalizer whole, forward
and backward, with the CPU inductor: results equal to eager within the documented tolerances,
and one graph for every batch shape (no recompilation when the shape changes)."""

import functools

import pytest
import torch
import torch._dynamo

from fairseq_entmax.normalizers import alpha_entmax, entmax15, softmax, sparsemax, topk_softmax

# torch.compile takes seconds to minutes per test on a CPU.
pytestmark = pytest.mark.slow

HEADS = 4

# name -> map(scores, alpha); alpha is one learned value per head, bounded by its clamp, as
# SparseMultiheadAttention calls it.
MAPS = {
    "softmax": lambda x, alpha: softmax(x),
    "sparsemax": lambda x, alpha: sparsemax(x),
    "entmax15": lambda x, alpha: entmax15(x),
    # max_alpha an argument of the compiled function, as SparseMultiheadAttention passes its
    # clamp: dynamic=True makes it a symbolic float (which once broke the capture)
    "alpha_entmax": functools.partial(alpha_entmax, dim=-1, max_alpha=2.0),
    "topk_softmax": lambda x, alpha: topk_softmax(x, 3),
    "topk_softmax_per_row": lambda x, alpha: topk_softmax(
        x, torch.ceil((x > float("-inf")).sum(-1, keepdim=True) * 0.3).long().clamp(min=1)
    ),
}


def scores_of_shape(batch, queries, keys, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, HEADS, queries, keys, generator=generator) * 3
    scores[0, :, :, keys - 3 :] = float("-inf")  # padded keys
    scores[-1, 0, 0] = float("-inf")  # a fully masked row
    return scores


def forward_backward(function, scores, upstream):
    scores = scores.clone().requires_grad_()
    alpha = torch.tensor([1.05, 1.3, 1.6, 2.0]).view(1, HEADS, 1, 1).requires_grad_()
    p = function(scores, alpha)
    (p * upstream).sum().backward()
    return p.detach(), scores.grad, alpha.grad


@pytest.mark.parametrize("name", MAPS)
def test_compiled_whole_equals_eager_for_every_shape(name):
    torch._dynamo.reset()
    compiled = torch.compile(MAPS[name], fullgraph=True, dynamic=True)
    for index, shape in enumerate([(3, 5, 12), (2, 7, 20)]):
        scores = scores_of_shape(*shape, seed=index)
        upstream = torch.randn(scores.shape, generator=torch.Generator().manual_seed(index))
        eager = forward_backward(MAPS[name], scores, upstream)
        # The second shape must reuse the first graph: a recompilation raises.
        with torch._dynamo.config.patch(error_on_recompile=index > 0):
            ours = forward_backward(compiled, scores, upstream)
        for what, expected, actual in zip(("p", "grad of scores", "grad of alpha"), eager, ours):
            if name != "alpha_entmax" and what == "grad of alpha":
                continue
            # float32: the compiled kernels sum in another order; the alpha gradient
            # divides by (alpha - 1)^2 and amplifies it.
            tolerance = 1e-4 if what == "grad of alpha" else 1e-6
            torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance, msg=f"{name}: {what}")
