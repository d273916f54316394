"""The normalizers' public API: names, input checks, masking, dtypes, shapes, imports."""

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fairseq_entmax.normalizers import (
    NORMALIZER_NAMES,
    alpha_entmax,
    entmax15,
    softmax,
    sparsemax,
    topk_softmax,
)
from normalizer_references import topk_softmax_reference

# Every normalizer as fn(scores, dim), with the extra argument fixed; alpha_entmax twice:
# a float alpha without a closed form, and a tensor alpha (one per row of a 3-D input).
NORMALIZERS = {
    "softmax": softmax,
    "sparsemax": sparsemax,
    "entmax15": entmax15,
    "alpha_entmax(1.3)": lambda x, dim=-1: alpha_entmax(x, 1.3, dim),
    "alpha_entmax(tensor)": lambda x, dim=-1: alpha_entmax(x, _alpha_like(x, dim), dim),
    "topk(2)": lambda x, dim=-1: topk_softmax(x, 2, dim),
}


def _alpha_like(x, dim):
    """One alpha per row along `dim`, values spread over [1.1, 2.4] (so > 2 is covered)."""
    if not (isinstance(dim, (int, np.integer)) and -x.dim() <= dim < x.dim()):
        return torch.tensor(1.3)  # leaves the invalid dim for alpha_entmax to reject
    shape = list(x.shape)
    shape[dim] = 1
    values = torch.linspace(1.1, 2.4, math.prod(shape), dtype=torch.float64)
    return values.reshape(shape).to(x.dtype if x.dtype == torch.float64 else torch.float32)


def test_the_docs_name_every_normalizer_of_the_factory():
    """docs/normalizers.md lists the names build_normalizer takes, in NORMALIZER_NAMES' order."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "normalizers.md").read_text(encoding="utf-8")
    listed = re.search(r"`name` is one of `NORMALIZER_NAMES` \(([^)]*)\)", docs.replace("\n", " "))
    assert listed, "docs/normalizers.md no longer lists the names"
    assert tuple(re.findall(r"`(\w+)`", listed.group(1))) == NORMALIZER_NAMES


@pytest.mark.parametrize("alpha", [0.5, 0.999, float("nan"), float("inf"), -1.0])
def test_bad_float_alpha_is_rejected(alpha):
    with pytest.raises(ValueError, match="alpha must be >= 1"):
        alpha_entmax(torch.randn(2, 3), alpha)


def test_bad_tensor_alpha_is_rejected():
    scores = torch.randn(2, 3, 4)
    for bad in (0.9, float("nan"), float("inf")):
        alpha = torch.full((2, 3, 1), 1.5)
        alpha[1, 2, 0] = bad
        with pytest.raises(ValueError, match="alpha must be >= 1"):
            alpha_entmax(scores, alpha)
    with pytest.raises(ValueError, match="size 1 along dim"):
        alpha_entmax(scores, torch.full((2, 3, 4), 1.5))  # not size 1 along dim
    with pytest.raises(ValueError, match="broadcastable"):
        alpha_entmax(scores, torch.full((5, 1), 1.5))
    with pytest.raises(ValueError, match="alpha must be >= 1"):
        alpha_entmax(scores, torch.tensor([2]))  # an integer tensor


@pytest.mark.parametrize("k", [0, -1, 2.0, 1.5, "3", True, None])
def test_bad_k_is_rejected(k):
    with pytest.raises(ValueError, match="integer >= 1"):
        topk_softmax(torch.randn(2, 5), k)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_bad_scores_and_dim_are_rejected(name):
    fn = NORMALIZERS[name]
    with pytest.raises(TypeError, match="floating point"):
        fn(torch.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="dim"):
        fn(torch.randn(2, 3), dim=2)
    with pytest.raises(TypeError, match="dim must be an integer, got float"):
        fn(torch.randn(2, 3), dim=1.0)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_dim_may_be_any_integer_type(name):
    """As in torch: a numpy integer (e.g. from an array's shape arithmetic) is a dim."""
    fn = NORMALIZERS[name]
    scores = torch.randn(2, 3, 4)
    assert torch.equal(fn(scores, dim=np.int64(-2)), fn(scores, dim=-2))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_masked_entries_get_zero_weight_and_zero_gradient(name):
    fn = NORMALIZERS[name]
    torch.manual_seed(0)
    scores = torch.randn(3, 4, 6, dtype=torch.float64)
    scores[0, 1, [0, 3]] = float("-inf")  # padding
    scores[1, :, 4:] = float("-inf")
    scores[2, 2, :] = float("-inf")  # a fully masked row
    scores.requires_grad_()
    p = fn(scores)
    p.backward(torch.randn_like(p))
    masked = torch.isinf(scores.detach())
    assert torch.all(p[masked] == 0)
    assert torch.all(scores.grad[masked] == 0)
    assert torch.all(p[2, 2] == 0) and torch.all(scores.grad[2, 2] == 0)
    assert torch.isfinite(p).all() and torch.isfinite(scores.grad).all()
    sums = p.sum(-1)
    sums[2, 2] += 1  # the fully masked row sums to 0
    torch.testing.assert_close(sums, torch.ones_like(sums))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
@pytest.mark.parametrize("magnitude", [1e4, 1e30])
def test_huge_scores_stay_finite(name, magnitude):
    fn = NORMALIZERS[name]
    torch.manual_seed(0)
    scores = (torch.randn(4, 5, 16) * magnitude).requires_grad_()
    scores.data[0, 0, 3] = float("-inf")
    p = fn(scores)
    p.backward(torch.randn_like(p))
    assert torch.isfinite(p).all() and torch.isfinite(scores.grad).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 5))
    # At this scale every row is one-hot on its maximum.
    assert torch.equal(p.argmax(-1), scores.detach().argmax(-1))
    assert torch.all(p.max(-1).values > 0.99)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(name, dtype):
    fn = NORMALIZERS[name]
    torch.manual_seed(0)
    scores = (torch.randn(4, 3, 12) * 3).to(dtype)
    scores[0, 0, :5] = float("-inf")
    scores[1, 1, :] = float("-inf")
    scores[2, 2, 0] = -60000.0 if dtype == torch.float16 else -1e38  # very negative logit
    scores.requires_grad_()
    upstream = torch.randn(4, 3, 12).to(dtype)
    p = fn(scores)
    p.backward(upstream)
    assert p.dtype == dtype and scores.grad.dtype == dtype
    assert torch.isfinite(p).all() and torch.isfinite(scores.grad).all()
    # Same as the float32 computation, rounded to the input dtype.
    reference_scores = scores.detach().float().requires_grad_()
    reference = fn(reference_scores)
    reference.backward(upstream.float())
    tolerance = 1e-2 if dtype == torch.bfloat16 else 2e-3
    torch.testing.assert_close(p.float(), reference, atol=tolerance, rtol=0)
    torch.testing.assert_close(scores.grad.float(), reference_scores.grad, atol=4 * tolerance, rtol=0)


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
@pytest.mark.parametrize("dim", [0, 1, -2, 2])
def test_any_dim_and_non_contiguous_input(name, dim):
    fn = NORMALIZERS[name]
    torch.manual_seed(0)
    base = torch.randn(5, 6, 7, dtype=torch.float64)
    upstream = torch.randn(5, 6, 7, dtype=torch.float64)
    # Reference: the same map applied along the last dim of a contiguous copy.
    moved = base.movedim(dim, -1).contiguous().requires_grad_()
    expected = fn(moved)
    expected.backward(upstream.movedim(dim, -1))
    # Non-contiguous: a transposed view of another layout holding the same values.
    scores = base.transpose(0, 2).contiguous().transpose(0, 2).requires_grad_()
    assert not scores.is_contiguous()
    p = fn(scores, dim=dim)
    p.backward(upstream)
    torch.testing.assert_close(p, expected.movedim(-1, dim))
    torch.testing.assert_close(scores.grad, moved.grad.movedim(-1, dim))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)])
def test_empty_tensors(name, shape):
    fn = NORMALIZERS[name]
    scores = torch.randn(*shape, requires_grad=True)
    p = fn(scores)
    assert p.shape == scores.shape
    p.sum().backward()
    assert scores.grad.shape == scores.shape


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_rows_of_length_one(name):
    fn = NORMALIZERS[name]
    scores = torch.tensor([[3.0], [-1e30], [float("-inf")], [0.0]], requires_grad=True)
    p = fn(scores)
    p.backward(torch.ones_like(p))
    assert torch.equal(p.detach(), torch.tensor([[1.0], [1.0], [0.0], [1.0]]))
    assert torch.equal(scores.grad, torch.zeros_like(scores))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_backward_keeps_only_the_output(name):
    """Memory: what a normalizer saves for backward is its output (and alpha), nothing
    of the size of the input besides."""
    fn = NORMALIZERS[name]
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    scores = torch.randn(4, 8, 16, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        p = fn(scores)
    big = [t for t in saved if t.numel() > 4 * 8]  # alpha has at most one value per row
    assert len(big) == 1
    assert big[0].data_ptr() == p.data_ptr() and big[0].shape == p.shape


def test_alpha_gradient_reaches_a_learned_parameter():
    """alpha = 1 + sigmoid(a) per head, as the fairseq layer uses it."""
    torch.manual_seed(0)
    logits = torch.zeros(4, requires_grad=True)
    scores = torch.randn(2, 4, 5, 6)
    alpha = (1 + torch.sigmoid(logits)).view(1, 4, 1, 1)
    loss = (alpha_entmax(scores, alpha) * torch.randn(2, 4, 5, 6)).sum()
    loss.backward()
    assert logits.grad.shape == (4,)
    assert torch.isfinite(logits.grad).all() and torch.all(logits.grad != 0)


def test_float_alpha_with_closed_form_uses_exact_map():
    torch.manual_seed(0)
    scores = torch.randn(6, 9)
    assert torch.equal(alpha_entmax(scores, 1), softmax(scores))
    assert torch.equal(alpha_entmax(scores, 1.5), entmax15(scores))
    assert torch.equal(alpha_entmax(scores, 2.0), sparsemax(scores))


def test_topk_with_one_k_per_row_against_the_reference():
    """k as a tensor: each row keeps its own number of keys (float64, masked entries, a k
    beyond the row length, k along another dim), forward and gradient."""
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 6, dtype=torch.float64)
    scores[0, 1, :4] = float("-inf")
    k = torch.tensor([[1], [2], [7]]).expand(2, 3, 1)
    expected = torch.stack(
        [
            torch.stack(
                [torch.from_numpy(topk_softmax_reference(scores[b, r].numpy(), int(k[b, r, 0]))) for r in range(3)]
            )
            for b in range(2)
        ]
    )
    p = topk_softmax(scores, k)
    torch.testing.assert_close(p, expected, atol=1e-12, rtol=0)
    # Each row as a call with its own int k: the same values and gradients.
    upstream = torch.randn_like(scores)
    leaf = scores.clone().requires_grad_()
    topk_softmax(leaf, k).backward(upstream)
    for b in range(2):
        for r in range(3):
            row = scores[b, r].clone().requires_grad_()
            topk_softmax(row, int(k[b, r, 0])).backward(upstream[b, r])
            torch.testing.assert_close(leaf.grad[b, r], row.grad, atol=1e-12, rtol=0)
    transposed = topk_softmax(scores.transpose(1, 2), k.transpose(1, 2), dim=1)
    torch.testing.assert_close(transposed, expected.transpose(1, 2), atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "k, message",
    [
        (torch.tensor([[2], [0]]), "k contains 0"),
        (torch.tensor([[2.0], [1.0]]), "dtype"),
        (torch.tensor([2, 3, 4]), "does not fit"),
        (torch.tensor([[[2]], [[3]]]), "does not fit"),
    ],
)
def test_bad_k_tensor_is_rejected(k, message):
    with pytest.raises(ValueError, match=message):
        topk_softmax(torch.randn(2, 5), k)


def test_topk_keeps_ties_and_large_k_is_softmax():
    scores = torch.tensor([[1.0, 3.0, 2.0, 3.0, 0.5]])
    p = topk_softmax(scores, 1)
    assert torch.equal(p, torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0]]))
    torch.testing.assert_close(topk_softmax(scores, 5), torch.softmax(scores, -1))
    torch.testing.assert_close(topk_softmax(scores, 50), torch.softmax(scores, -1))


@pytest.mark.parametrize("name", sorted(NORMALIZERS))
def test_many_blocks_give_the_same_result(name, monkeypatch):
    """Rows are processed a block at a time (fairseq_entmax.normalizers._common); blocks of
    a few rows, with a shorter last block, give the same values and gradients as one block."""
    import fairseq_entmax.normalizers._common as common

    fn = NORMALIZERS[name]
    torch.manual_seed(0)
    scores = torch.randn(5, 7, 9, dtype=torch.float64)
    scores[1, 2, :4] = float("-inf")
    scores[3, 3, :] = float("-inf")
    upstream = torch.randn(5, 7, 9, dtype=torch.float64)
    results = []
    # one block; blocks of 2 rows (35 rows: 18 blocks), or of 8 for the wide-block maps (5 blocks)
    for block_elements in (1 << 18, 2 * 9):
        monkeypatch.setattr(common, "BLOCK_ELEMENTS", block_elements)
        x = scores.clone().requires_grad_()
        p = fn(x)
        p.backward(upstream)
        results.append((p.detach(), x.grad))
    torch.testing.assert_close(results[0], results[1], atol=1e-12, rtol=0)


@pytest.mark.slow
def test_first_alpha_entmax_call_imports_nothing_heavy():
    """Checking alpha's shape once went through torch.broadcast_shapes, whose first call
    imports torch's symbolic-shapes machinery: about 0.3 s in every fairseq-generate run."""
    code = (
        "import sys, torch\n"
        "from fairseq_entmax.normalizers import alpha_entmax\n"
        "alpha_entmax(torch.randn(2, 8, 3, 5), torch.full((1, 8, 1, 1), 1.3))\n"
        "print('torch.fx.experimental.symbolic_shapes' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


@pytest.mark.slow
def test_importing_the_normalizers_has_no_side_effects():
    """A user who wants the normalizers or the attention in their own model gets torch and nothing else:
    no fairseq, no transformers, no patched classes, no replaced excepthook."""
    code = (
        "import sys\n"
        "import fairseq_entmax, fairseq_entmax.normalizers, fairseq_entmax.attention\n"
        "print('fairseq' in sys.modules, 'transformers' in sys.modules, sys.excepthook is sys.__excepthook__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "False", "True"]
