"""Property tests (hypothesis) of the normalizers against their definitions, on every path
of tests/normalizer_paths.py: the early-exit one (the CPU's default), with and without
alpha_entmax's selected entries, and the sync-free one (GPUs, torch.compile)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fairseq_entmax.normalizers import alpha_entmax, entmax15, softmax, sparsemax, topk_softmax
from fairseq_entmax.normalizers.topk import largest_entries
from normalizer_paths import PATHS
from normalizer_references import (
    alpha_entmax_reference,
    apply_rows,
    entmax15_reference,
    sparsemax_reference,
    topk_softmax_reference,
)

SETTINGS = settings(max_examples=60, deadline=None)

on_every_path = pytest.mark.parametrize("path", PATHS)


@st.composite
def score_rows(draw, max_rows=4, max_len=10, allow_masked=True):
    """A (rows, d) float64 array of scores, some entries -inf, at least one finite per row.

    The values are multiples of 1/8 (times a power of two), so that adding a constant that
    is a multiple of 1/8 is exact and cannot create or break ties.
    """
    rows = draw(st.integers(1, max_rows))
    d = draw(st.integers(1, max_len))
    scale = draw(st.sampled_from([0.125, 1.0, 8.0]))
    values = draw(st.lists(st.integers(-40, 40), min_size=rows * d, max_size=rows * d))
    scores = np.array(values, dtype=np.float64).reshape(rows, d) / 8 * scale
    if allow_masked:
        masked = np.array(draw(st.lists(st.booleans(), min_size=rows * d, max_size=rows * d)))
        masked = masked.reshape(rows, d)
        masked[np.arange(rows), draw(st.integers(0, d - 1))] = False
        scores[masked] = -np.inf
    return scores


alphas = st.floats(1.0, 3.0).filter(lambda a: a == 1.0 or a >= 1.01)


def _maps(alpha, k):
    """(our map, independent float64 reference) pairs."""
    return [
        (softmax, lambda s: alpha_entmax_reference(s, 1.0)),
        (sparsemax, sparsemax_reference),
        (entmax15, entmax15_reference),
        (
            lambda x: alpha_entmax(x, torch.full((x.shape[0], 1), alpha, dtype=x.dtype)),
            lambda s: alpha_entmax_reference(s, alpha),
        ),
        (lambda x: topk_softmax(x, k), lambda s: topk_softmax_reference(s, k)),
    ]


@on_every_path
@SETTINGS
@given(score_rows(), alphas, st.integers(1, 12))
def test_matches_independent_reference_and_lies_on_simplex(path, scores, alpha, k):
    with PATHS[path]():
        x = torch.from_numpy(scores)
        for ours, reference in _maps(alpha, k):
            p = ours(x)
            expected = apply_rows(reference, scores)
            np.testing.assert_allclose(p.numpy(), expected, atol=1e-9)
            assert torch.all(p >= 0)
            np.testing.assert_allclose(p.sum(-1).numpy(), 1.0, atol=1e-12)
            assert torch.all(p[torch.isinf(x)] == 0)


@on_every_path
@SETTINGS
@given(score_rows(allow_masked=False), alphas)
def test_sparse_maps_are_exact_threshold_functions(path, scores, alpha):
    """Exact zeros outside the support: p_i = [(alpha-1) z_i - tau]_+^(1/(alpha-1)) with
    one tau per row, recovered from the support, and p_i = 0 exactly where
    (alpha-1) z_i <= tau."""
    with PATHS[path]():
        x = torch.from_numpy(scores)
        for a, p in [
            (2.0, sparsemax(x)),
            (1.5, entmax15(x)),
            (max(alpha, 1.05), alpha_entmax(x, torch.full((x.shape[0], 1), max(alpha, 1.05), dtype=x.dtype))),
        ]:
            scaled = (a - 1) * x
            support = p > 0
            taus = torch.where(support, scaled - p ** (a - 1), torch.nan)
            tau = taus.nanmean(-1, keepdim=True)
            torch.testing.assert_close(torch.where(support, taus, tau), tau.expand_as(taus), atol=1e-7, rtol=0)
            off = ~support
            assert torch.all(scaled[off] <= (tau.expand_as(scaled)[off] + 1e-7))


@SETTINGS
@given(st.integers(1, 3), st.integers(200, 1500), st.integers(1, 5), st.integers(0, 2**32 - 1), st.booleans())
def test_topk_of_long_rows_matches_the_reference(rows, d, k, seed, masked):
    """Rows of 256 keys or more are searched by chunks (topk.largest_entries): the same map and
    the same largest entries, with few distinct values, so that ties cross the chunks, and
    masked keys."""
    generator = np.random.default_rng(seed)
    scores = generator.integers(-6, 6, size=(rows, d)).astype(np.float64)
    if masked:
        scores[generator.random((rows, d)) < 0.9] = -np.inf
        scores[:, generator.integers(0, d)] = 0.0
    p = topk_softmax(torch.from_numpy(scores), k)
    np.testing.assert_allclose(p.numpy(), apply_rows(lambda s: topk_softmax_reference(s, k), scores), atol=1e-12)
    # the k + 1 largest, as blocked attention's top-k asks for them: values and where they are
    x = torch.from_numpy(scores)
    values, indices = largest_entries(x, k + 1)
    assert torch.equal(values, torch.topk(x, k + 1, dim=-1).values)
    assert torch.equal(x.gather(-1, indices), values)
    assert all(len(set(row)) == k + 1 for row in indices.tolist())
    unordered, where = largest_entries(x, k + 1, ordered=False)
    assert torch.equal(unordered.sort(dim=-1, descending=True).values, values)
    assert torch.equal(x.gather(-1, where), unordered)


@SETTINGS
@given(score_rows(), st.integers(-800, 800), alphas, st.integers(1, 12))
def test_invariant_to_adding_a_constant_to_a_row(scores, eighths, alpha, k):
    x = torch.from_numpy(scores)
    constant = eighths / 8
    for ours, _ in _maps(alpha, k):
        torch.testing.assert_close(ours(x + constant), ours(x), atol=1e-9, rtol=0)


@SETTINGS
@given(score_rows(), st.randoms(use_true_random=False), alphas, st.integers(1, 12))
def test_permutation_equivariant(scores, random, alpha, k):
    x = torch.from_numpy(scores)
    order = list(range(x.shape[1]))
    random.shuffle(order)
    order = torch.tensor(order)
    for ours, _ in _maps(alpha, k):
        torch.testing.assert_close(ours(x[:, order]), ours(x)[:, order], atol=1e-10, rtol=0)


@SETTINGS
@given(score_rows(max_rows=6, max_len=40))
def test_general_alpha_path_agrees_with_special_maps_in_float32(scores):
    """alpha = 1, 1.5, 2 given as a tensor run the general root finder; they agree with
    softmax, entmax15 and sparsemax to 1e-6 in float32."""
    x = torch.from_numpy(scores).float()
    rows = x.shape[0]
    for alpha, exact in [(1.0, softmax), (1.5, entmax15), (2.0, sparsemax)]:
        general = alpha_entmax(x, torch.full((rows, 1), alpha))
        torch.testing.assert_close(general, exact(x), atol=1e-6, rtol=0)
    # and with one alpha per row, mixing the three
    alpha = torch.tensor([1.0, 1.5, 2.0] * rows)[:rows].view(rows, 1)
    expected = torch.stack([{1.0: softmax, 1.5: entmax15, 2.0: sparsemax}[a.item()](row) for a, row in zip(alpha, x)])
    torch.testing.assert_close(alpha_entmax(x, alpha), expected, atol=1e-6, rtol=0)


@on_every_path
@pytest.mark.parametrize(
    "dtype, alpha_range, bound",
    [
        (torch.float32, (1.01, 2.0), 1e-6),
        (torch.float32, (2.0, 3.0), 3e-6),
        (torch.float64, (1.01, 2.0), 1e-13),
        (torch.float64, (2.0, 3.0), 1e-13),
    ],
)
def test_alpha_entmax_accuracy_stated_in_docstring(path, dtype, alpha_range, bound):
    """Max abs error of alpha_entmax against float64 bisection run to convergence, over
    attention-like rows (scores of scale 1 and 10, 1 to 512 keys)."""
    with PATHS[path]():
        generator = torch.Generator().manual_seed(0)
        low, high = alpha_range
        worst = 0.0
        for d in (1, 7, 64, 512):
            for scale in (1.0, 10.0):
                scores = torch.randn(16, d, generator=generator, dtype=torch.float64) * scale
                alpha = low + torch.rand(16, 1, generator=generator, dtype=torch.float64) * (high - low)
                p = alpha_entmax(scores.to(dtype), alpha.to(dtype)).double()
                expected = np.stack([alpha_entmax_reference(row, a.item()) for row, a in zip(scores.numpy(), alpha)])
                worst = max(worst, np.abs(p.numpy() - expected).max())
        assert worst <= bound


@on_every_path
@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-6), (torch.float64, 1e-13)])
def test_entmax15_accuracy_stated_in_docstring(path, dtype, bound):
    """Max abs error of entmax15 (Newton steps to a tolerance) against the exact sort-based
    float64 reference, over attention-like rows (scores of scale 1 and 10, 1 to 512 keys)."""
    with PATHS[path]():
        generator = torch.Generator().manual_seed(0)
        worst = 0.0
        for d in (1, 7, 64, 512):
            for scale in (1.0, 10.0):
                scores = torch.randn(64, d, generator=generator, dtype=torch.float64) * scale
                p = entmax15(scores.to(dtype)).double()
                expected = apply_rows(entmax15_reference, scores.numpy())
                worst = max(worst, np.abs(p.numpy() - expected).max())
        assert worst <= bound


@on_every_path
@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1.5e-4), (torch.float64, 1e-8)])
def test_alpha_entmax_close_to_one_is_finite_with_the_error_stated_in_docstring(path, dtype, bound):
    """alpha - 1 from 1e-12 to 1e-2, where the threshold search alone loses digits as
    eps / (alpha - 1) and, in float32, returned NaN at alpha - 1 = 1e-6 and 1e-7: no NaN, and
    the error against the float64 reference stays within the docstring's bound."""
    with PATHS[path]():
        generator = torch.Generator().manual_seed(0)
        worst = 0.0
        for am1 in (1e-12, 1e-9, 3e-9, 1e-7, 1e-6, 1e-5, 5e-5, 7e-5, 1e-4, 1e-3, 1e-2):
            scores = torch.randn(32, 50, generator=generator, dtype=torch.float64) * 3
            scores[:4, :10] = float("-inf")
            alpha = torch.full((32, 1), 1 + am1, dtype=torch.float64).to(dtype)
            p = alpha_entmax(scores.to(dtype), alpha).double()
            assert torch.isfinite(p).all(), am1
            expected = np.stack(
                [alpha_entmax_reference(row, a.item()) for row, a in zip(scores.numpy(), alpha.double())]
            )
            worst = max(worst, np.abs(p.numpy() - expected).max())
        assert worst <= bound
