"""fairseq_entmax.attention.scaled_dot_product_attention against independent references: the
materialized path (scores, the normalizer, times the values), torch's own function for softmax,
float64 gradcheck; and what it promises beyond them: no tensor of the score matrix's size, key
blocks that a mask hides never computed, dropout replayed in the backward, clear errors."""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fairseq_entmax.attention import blocked, scaled_dot_product_attention
from fairseq_entmax.normalizers import NORMALIZER_NAMES, build_normalizer

# batch, heads, key/value heads, queries, keys, head dim: several blocks of 8 queries.
B, H, L, S, E = 2, 4, 37, 45, 8
WINDOW = 6


def _normalizer(name, heads=H):
    torch.manual_seed(5)
    if name == "alpha_entmax":
        return build_normalizer(name, heads, alpha_init="random")
    return build_normalizer(name, heads, topk=5)


def _materialized(query, key, value, mask, is_causal, normalizer, scale=None):
    """Scores, masked with -inf, the normalizer module on (batch * heads, queries, keys), times values."""
    heads = query.shape[-3]
    if key.shape[-3] != heads:
        key = key.repeat_interleave(heads // key.shape[-3], dim=-3)
        value = value.repeat_interleave(heads // value.shape[-3], dim=-3)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    if is_causal:
        scores = scores.masked_fill(torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    queries, keys = scores.shape[-2:]
    weights = normalizer(scores.reshape(-1, heads, queries, keys).flatten(0, 1)).view(scores.shape)
    return torch.matmul(weights, value)


def _case(case, dtype=torch.float32, seed=0):
    """(query, key, value, mask, is_causal) of a named case; scores spread enough for sparse maps
    to leave out keys the query sees."""
    generator = torch.Generator().manual_seed(seed)
    keys = L if case in ("causal", "window") else S
    kv_heads = 2 if case == "gqa" else H

    def normal(*shape):
        return (2.0 * torch.randn(*shape, generator=generator, dtype=dtype)).requires_grad_()

    query, key, value = normal(B, H, L, E), normal(B, kv_heads, keys, E), normal(B, kv_heads, keys, E)
    mask = None
    if case == "padding":  # each sentence's own keys, and a query that sees none
        lengths = torch.tensor([S, S - 11])
        mask = (torch.arange(S) < lengths[:, None]).view(B, 1, 1, S).expand(B, 1, L, S).clone()
        mask[1, 0, 3] = False
    elif case == "window":
        position = torch.arange(L)
        offset = position[:, None] - position
        mask = (offset >= 0) & (offset < WINDOW)
    elif case == "bias":  # an additive per-head bias that learns, as T5's, with -inf on some keys
        mask = torch.randn(1, H, L, S, generator=generator, dtype=dtype)
        mask[..., -3:] = float("-inf")
        mask.requires_grad_()
    return query, key, value, mask, case == "causal"


def _gradients(output, tensors, seed=1):
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(seed), dtype=output.dtype)
    return torch.autograd.grad(output, tensors, weights)


def _assert_relatively_close(actual, expected, tolerance, what):
    """Every entry within `tolerance` times the largest magnitude of the expected tensor."""
    scale = float(expected.detach().abs().max())
    torch.testing.assert_close(actual, expected, atol=tolerance * max(scale, 1e-30), rtol=0, msg=what)


@pytest.mark.parametrize("case", ["padding", "causal", "window", "bias", "gqa"])
@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_outputs_and_gradients_equal_the_materialized_path(name, case):
    """Outputs and the gradients of query, key, value, the additive mask and the learned alphas
    agree with the materialized path to 1e-5 of their scale, in float32, over several blocks of
    queries and of the batch."""
    normalizer = _normalizer(name)
    query, key, value, mask, is_causal = _case(case)
    inputs = [query, key, value] + ([mask] if case == "bias" else []) + list(normalizer.parameters())
    blocked = scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        is_causal=is_causal,
        enable_gqa=case == "gqa",
        normalizer=normalizer,
        block_queries=8,
    )
    expected = _materialized(query, key, value, mask, is_causal, normalizer)
    _assert_relatively_close(blocked, expected, 1e-5, "output")
    for index, (actual, reference) in enumerate(zip(_gradients(blocked, inputs), _gradients(expected, inputs))):
        assert float(reference.abs().max()) > 0, f"input {index} gets no gradient: a check that cannot fail"
        _assert_relatively_close(actual, reference, 1e-5, f"gradient of input {index}")
    if name != "softmax":  # the sparse maps do leave out keys the query sees
        weights_seen = _materialized(
            query, key, torch.eye(key.shape[-2]).expand(B, key.shape[1], -1, -1), mask, is_causal, normalizer
        )
        assert bool((weights_seen == 0).any())


@pytest.fixture
def specs(monkeypatch):
    """The _Spec of each call of the blocked function in the test: its blocks and support map."""
    made = []
    spec_init = blocked._Spec.__init__

    def recording(self, *args):
        spec_init(self, *args)
        made.append(self)

    monkeypatch.setattr(blocked._Spec, "__init__", recording)
    return made


@pytest.mark.parametrize("case", ["causal", "bias", "gqa"])
@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_blocks_of_fewer_heads_equal_the_materialized_path(name, case, specs, monkeypatch):
    """Where a block of every head would pass its budget, the blocks take two heads (with GQA,
    the two that share a key head) before they take fewer queries: outputs and the gradients of
    query, key, value, a per-head bias and the alphas agree with the materialized path in
    float64 to 1e-12 of their scale."""
    keys = L if case == "causal" else S
    monkeypatch.setitem(blocked.BLOCK_ELEMENTS, "cpu", 2 * 8 * keys)  # two heads of 8 queries
    normalizer = _normalizer(name).double()
    query, key, value, mask, is_causal = _case(case, dtype=torch.float64)
    inputs = [query, key, value] + ([mask] if case == "bias" else []) + list(normalizer.parameters())
    arguments = dict(attn_mask=mask, is_causal=is_causal, enable_gqa=case == "gqa", normalizer=normalizer)
    actual = scaled_dot_product_attention(query, key, value, block_queries=8, **arguments)
    [spec] = specs
    assert spec.blocks and all(h1 - h0 == 2 and h0 % 2 == 0 for _, _, h0, h1, *_ in spec.blocks), spec.blocks
    expected = _materialized(query, key, value, mask, is_causal, normalizer)
    _assert_relatively_close(actual, expected, 1e-12, "output")
    for index, (got, reference) in enumerate(zip(_gradients(actual, inputs), _gradients(expected, inputs))):
        _assert_relatively_close(got, reference, 1e-12, f"gradient of input {index}")


def test_entmax_blocks_take_half_the_elements_but_64_queries_of_a_head():
    """The searches of 1.5-entmax and alpha-entmax hold more scratch than the other maps: their
    blocks take half of BLOCK_ELEMENTS (2^20 on the CPU), but no fewer than MIN_BLOCK_QUERIES
    queries of one head, whose products would be slower."""
    from fairseq_entmax.normalizers.recomputable import recomputable_rows

    def largest_block(name, tokens):
        share = recomputable_rows(_normalizer(name, heads=8))[0].block_share
        blocks = blocked._blocks((1, 8, tokens, tokens), 1, 64, None, False, torch.device("cpu"), None, share)
        return max((b1 - b0) * (h1 - h0) * (q1 - q0) * (k1 - k0) for b0, b1, h0, h1, q0, q1, k0, k1 in blocks)

    names = ("softmax", "topk", "sparsemax", "entmax15", "alpha_entmax")
    assert [largest_block(name, 4096) for name in names] == [2**20, 2**20, 2**20, 2**19, 2**19]
    assert [largest_block(name, 16384) for name in names] == [2**20] * 5


@pytest.mark.parametrize(
    "case",
    [
        dict(),
        dict(is_causal=True),
        dict(mask="bool"),
        dict(mask="float"),
        dict(gqa=True),
        dict(scale=0.3, batch_dims=(2, 3)),
        dict(queries_more_than_keys=True, is_causal=True),
    ],
    ids=["plain", "causal", "bool-mask", "float-mask", "gqa", "scale-5d", "causal-more-queries"],
)
def test_softmax_equals_torchs_function(case):
    generator = torch.Generator().manual_seed(3)
    batch_dims = case.get("batch_dims", (B,))
    queries = S + 9 if case.get("queries_more_than_keys") else L
    kv_heads = 2 if case.get("gqa") else H
    query = torch.randn(*batch_dims, H, queries, E, generator=generator, requires_grad=True)
    key = torch.randn(*batch_dims, kv_heads, S, E, generator=generator, requires_grad=True)
    value = torch.randn(*batch_dims, kv_heads, S, E, generator=generator, requires_grad=True)
    mask = None
    if case.get("mask") == "bool":
        mask = torch.rand(B, 1, queries, S, generator=generator) > 0.3
        mask[..., 0] = True  # torch's softmax gives NaN to a query that sees nothing
    elif case.get("mask") == "float":
        mask = torch.randn(H, queries, S, generator=generator)
    arguments = dict(attn_mask=mask, is_causal=case.get("is_causal", False), scale=case.get("scale"))
    arguments["enable_gqa"] = bool(case.get("gqa"))
    ours = scaled_dot_product_attention(query, key, value, block_queries=8, **arguments)
    torchs = torch.nn.functional.scaled_dot_product_attention(query, key, value, **arguments)
    _assert_relatively_close(ours, torchs, 1e-5, "output")
    for actual, expected in zip(_gradients(ours, [query, key, value]), _gradients(torchs, [query, key, value])):
        _assert_relatively_close(actual, expected, 1e-5, "gradient")


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_float64_gradcheck(name):
    """Finite differences in float64, the mask's and the alphas' gradients included (the alphas
    as a float64 tensor: the module computes its own in float32)."""
    normalizer = _normalizer(name, heads=2).double()
    generator = torch.Generator().manual_seed(4)
    query, key, value = (torch.randn(1, 2, n, 3, generator=generator, dtype=torch.float64) for n in (5, 6, 6))
    bias = torch.randn(2, 5, 6, generator=generator, dtype=torch.float64)
    bias[0, :, -1] = float("-inf")
    inputs = [t.requires_grad_() for t in (query, key, value, bias)]
    if name == "alpha_entmax":
        alpha = torch.tensor([1.3, 2.4], dtype=torch.float64, requires_grad=True)
        normalizer.head_alpha = lambda: alpha
        inputs.append(alpha)

    def attention(query, key, value, bias, *alpha):
        return scaled_dot_product_attention(query, key, value, attn_mask=bias, normalizer=normalizer, block_queries=2)

    assert torch.autograd.gradcheck(attention, inputs, eps=1e-6, atol=1e-7)


def test_dropout_is_replayed_in_the_backward():
    """With dropout, the gradients are those of the forward's own keep mask (gradcheck under
    one seed), a seed repeats the output, and the output is unbiased (its mean over draws)."""
    normalizer = _normalizer("entmax15", heads=2).double()
    generator = torch.Generator().manual_seed(6)
    inputs = [torch.randn(1, 2, n, 3, generator=generator, dtype=torch.float64, requires_grad=True) for n in (6, 7, 7)]

    def attention(query, key, value):
        torch.manual_seed(11)
        return scaled_dot_product_attention(
            query, key, value, dropout_p=0.4, normalizer=normalizer, block_queries=2, is_causal=True
        )

    assert torch.autograd.gradcheck(attention, inputs, eps=1e-6, atol=1e-7)
    first, again = attention(*inputs), attention(*inputs)
    assert torch.equal(first, again)
    without = scaled_dot_product_attention(*inputs, normalizer=normalizer, block_queries=2, is_causal=True)
    assert not torch.allclose(first, without)
    draws = torch.stack(
        [
            scaled_dot_product_attention(*inputs, dropout_p=0.4, normalizer=normalizer, block_queries=2, is_causal=True)
            for _ in range(400)
        ]
    )
    # The mean of 400 draws is within 5 standard errors of the output without dropout.
    standard_error = draws.std(dim=0) / math.sqrt(len(draws))
    assert bool(((draws.mean(dim=0) - without).abs() <= 5 * standard_error + 1e-12).all())


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_masked_rows_extreme_scores_and_nan(name):
    """A query that sees no key gets zeros and no gradient; scores of 1e30 keep the
    materialized path's answer; a NaN in a query reaches that query's output only."""
    normalizer = _normalizer(name)
    query, key, value, mask, _ = _case("padding")
    output = scaled_dot_product_attention(query, key, value, attn_mask=mask, normalizer=normalizer, block_queries=8)
    assert torch.equal(output[1, :, 3], torch.zeros_like(output[1, :, 3]))
    grad_query = _gradients(output, [query])[0]
    assert torch.equal(grad_query[1, :, 3], torch.zeros_like(grad_query[1, :, 3]))

    with torch.no_grad():
        huge = query * 1e28  # scores of order 1e29
        expected = _materialized(huge, key, value, mask, False, normalizer)
        blocked = scaled_dot_product_attention(huge, key, value, attn_mask=mask, normalizer=normalizer, block_queries=8)
        torch.testing.assert_close(blocked, expected, atol=1e-5, rtol=1e-5)
        assert torch.isfinite(blocked).all()

        poisoned = query.detach().clone()
        poisoned[0, 1, 5, 2] = float("nan")
        output = scaled_dot_product_attention(poisoned, key, value, normalizer=normalizer, block_queries=8)
        assert torch.isnan(output[0, 1, 5]).all()
        output[0, 1, 5] = 0.0
        assert torch.isfinite(output).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["softmax", "entmax15", "alpha_entmax"])
def test_half_precision_is_computed_in_float32(name, dtype):
    """Half inputs give a result in their dtype equal to the float32 computation on the same
    (rounded) inputs, to the rounding of the result."""
    normalizer = _normalizer(name)
    query, key, value, mask, _ = _case("padding", dtype=dtype)
    half = scaled_dot_product_attention(query, key, value, attn_mask=mask, normalizer=normalizer, block_queries=8)
    assert half.dtype == dtype
    single = scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=mask, normalizer=normalizer, block_queries=8
    )
    torch.testing.assert_close(half.float(), single.to(dtype).float(), atol=0, rtol=0)
    gradients = _gradients(half, [query, key, value])
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in gradients)


class _LargestTensors(TorchDispatchMode):
    """Records the number of elements of every tensor an aten operation returns, and the scores
    computed (the elements of the batched products whose last dim is keys), and the largest of
    those products."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.score_elements = 0
        self.largest_scores = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for tensor in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        if func is torch.ops.aten.bmm.default and args[1].shape[-1] != E:  # q @ k^T, not p @ v
            self.score_elements += result.numel()
            self.largest_scores = max(self.largest_scores, result.numel())
        return result


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_no_tensor_holds_the_score_matrix(name):
    """Forward and backward at 512 tokens, batch 2, with the default blocks: no operation returns
    a tensor of more than a sixteenth of the (batch x heads, queries, keys) elements."""
    normalizer = _normalizer(name)
    tokens = 512
    query, key, value = (torch.randn(2, H, tokens, E, requires_grad=True) for _ in range(3))
    with _LargestTensors() as recorder:
        output = scaled_dot_product_attention(query, key, value, is_causal=True, normalizer=normalizer)
        output.sum().backward()
    assert 0 < recorder.largest <= 2 * H * tokens * tokens // 16
    assert query.grad is not None and key.grad is not None and value.grad is not None


@pytest.mark.parametrize("case", ["padding", "bias", "gqa"])
@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_a_small_call_is_computed_materialized_with_the_same_result(name, case, monkeypatch):
    """A call whose probabilities hold at most MATERIALIZED_PER_INPUT_ELEMENT times the inputs'
    elements computes its scores in one product (faster there than recomputing them), unless
    block_queries is given; outputs and gradients equal those of the blocks to 1e-5 of their
    scale. (The rule's factor is raised so that these inputs, of head dim 8, make a small call.)"""
    monkeypatch.setattr(blocked, "MATERIALIZED_PER_INPUT_ELEMENT", 4)
    normalizer = _normalizer(name)
    query, key, value, mask, _ = _case(case)
    assert B * H * L * S <= blocked.MATERIALIZED_PER_INPUT_ELEMENT * (query.numel() + key.numel() + value.numel())
    inputs = [query, key, value] + ([mask] if case == "bias" else []) + list(normalizer.parameters())
    results = []
    for block_queries in (None, 8):
        with _LargestTensors() as recorder:
            output = scaled_dot_product_attention(
                query,
                key,
                value,
                attn_mask=mask,
                enable_gqa=case == "gqa",
                normalizer=normalizer,
                block_queries=block_queries,
            )
        assert (recorder.largest_scores == B * H * L * S) == (block_queries is None)
        results.append((output, _gradients(output, inputs)))
    (small, small_gradients), (blocks, blocks_gradients) = results
    _assert_relatively_close(small, blocks, 1e-5, "output")
    for index, (actual, expected) in enumerate(zip(small_gradients, blocks_gradients)):
        _assert_relatively_close(actual, expected, 1e-5, f"gradient of input {index}")


@pytest.mark.parametrize("mask_kind", ["causal", "window"])
def test_key_blocks_a_mask_hides_are_not_computed(mask_kind):
    """A causal mask computes about half the scores, a sliding window about window / keys of them
    (plus a block's width), in the forward; no mask computes all of them."""
    tokens, block = 256, 16
    query, key, value = (torch.randn(1, H, tokens, E) for _ in range(3))
    position = torch.arange(tokens)
    window = (position[:, None] - position >= 0) & (position[:, None] - position < 32)
    arguments = dict(is_causal=True) if mask_kind == "causal" else dict(attn_mask=window)
    counts = {}
    for label, extra in (("none", {}), ("masked", arguments)):
        with _LargestTensors() as recorder:
            scaled_dot_product_attention(query, key, value, block_queries=block, **extra)
        counts[label] = recorder.score_elements
    assert counts["none"] == H * tokens * tokens
    if mask_kind == "causal":
        expected = H * sum(block * min(tokens, q0 + block) for q0 in range(0, tokens, block))
    else:
        expected = H * sum(block * (q0 + block - max(0, q0 - 31)) for q0 in range(0, tokens, block))
    assert counts["masked"] == expected


def _clustered_case(kv_heads=H, tokens=512, dim=16, seed=0, dtype=torch.float64):
    """(query, key, value, bias) where, as in trained sparse heads, the scores fall with the
    distance between query and key and the first 3 keys are seen from everywhere: an additive
    bias (with a gradient) of -0.5 per position of distance, and 0 on those keys, plus scores
    of small random queries and keys."""
    generator = torch.Generator().manual_seed(seed)

    def normal(heads):
        return (0.5 * torch.randn(1, heads, tokens, dim, generator=generator, dtype=dtype)).requires_grad_()

    position = torch.arange(tokens, dtype=dtype)
    bias = -0.5 * (position[:, None] - position).abs()
    bias[:, :3] = 0.0
    return normal(H), normal(kv_heads), normal(kv_heads), bias.expand(1, H, tokens, tokens).clone().requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_row_maps_recompute_their_forward_and_keep_its_zeros(name, dtype):
    """What the backward recomputes from a row's statistics is the forward's weights bit for
    bit; both are the normalizer module's, with zeros where it has zeros, and weights where it
    has more than 2e-35 (the floor of alpha-entmax's power), masked keys and a fully masked
    row included."""
    from fairseq_entmax.normalizers.recomputable import recomputable_rows

    normalizer = _normalizer(name)
    rows_map, _ = recomputable_rows(normalizer)
    generator = torch.Generator().manual_seed(0)
    scores = 3.0 * torch.randn(2, H, 16, 300, generator=generator, dtype=dtype)
    scores[..., 250:] = float("-inf")
    scores[1, 2, 7] = float("-inf")
    flat = scores.reshape(-1, 300)
    with torch.no_grad():
        expected = normalizer(flat.view(2 * H, 16, 300)).reshape(-1, 300)
        params = rows_map.block_params(scores, 0)
        weights, stats = rows_map.forward(flat.clone(), params)
        assert torch.equal(rows_map.recompute(flat.clone(), stats, params), weights)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(weights, expected, atol=tolerance, rtol=0)
    assert bool((weights[expected == 0] == 0).all())
    assert bool((weights[expected > 2e-35] > 0).all())
    if name != "softmax":
        assert bool((expected[:, :250] == 0).any())


@pytest.mark.parametrize("k", [5, 299, "per_row"])
def test_topk_recomputation_keeps_its_keys_when_scores_round_otherwise(k):
    """Blocked attention recomputes a block's scores in other shapes than its forward, and a
    matrix product of another shape may round otherwise (seen on an AMD EPYC CPU). Top-k's
    weights jump at its k-th key: recomputed from scores a few ulps lower, a row keeps the same
    keys with the same weights."""
    from fairseq_entmax.normalizers.recomputable import recomputable_rows

    rows_map, _ = recomputable_rows(_normalizer("topk"))
    generator = torch.Generator().manual_seed(0)
    flat = torch.randn(64, 300, generator=generator, dtype=torch.float64)
    flat[:8, 250:] = float("-inf")
    params = torch.randint(1, 300, (64, 1), generator=generator) if k == "per_row" else k
    with torch.no_grad():
        weights, stats = rows_map.forward(flat.clone(), params)
        lower = flat - 4 * torch.finfo(flat.dtype).eps * flat.abs()
        again = rows_map.recompute(lower, stats, params)
    assert torch.equal(again > 0, weights > 0)
    torch.testing.assert_close(again, weights, atol=1e-13, rtol=0)


@pytest.mark.parametrize("name", [name for name in NORMALIZER_NAMES if name != "softmax"])
def test_a_subsets_threshold_bounds_the_rows_support(name):
    """The forward searches only the key blocks whose largest score reaches the threshold of
    the rows' block maxima (may_weigh with their statistics), and reads the support map from
    the rows' own threshold: every score with weight, as the normalizer module computes it on
    the whole row, is at or above both, for rows of any spread, any subset, keys masked out."""
    from fairseq_entmax.normalizers.recomputable import recomputable_rows

    normalizer = _normalizer(name)
    rows_map, _ = recomputable_rows(normalizer)
    generator = torch.Generator().manual_seed(0)
    for spread in (0.1, 1.0, 10.0):
        scores = spread * torch.randn(2, H, 16, 300, generator=generator, dtype=torch.float64)
        scores[..., 290:] = float("-inf")
        flat = scores.reshape(-1, 300)
        with torch.no_grad():  # as in the forward of blocked attention
            weights = normalizer(flat.view(2 * H, 16, 300)).reshape(-1, 300)
            params = rows_map.block_params(scores, 0)
            for subset in (scores[..., ::64], scores[..., 5:9], scores[..., :290].amax(-1, keepdim=True), scores):
                _, stats = rows_map.forward(subset.reshape(len(flat), -1).clone(), params)
                may_weigh = rows_map.may_weigh(flat, stats, params)
                assert bool(may_weigh[weights > 0].all())
                if spread == 10.0 and name in ("sparsemax", "entmax15"):  # a bound that excludes
                    assert not bool(may_weigh[:, :290].all(dim=-1).any())


@pytest.mark.parametrize("case", ["bias", "causal", "window", "gqa", "masked_rows", "one_head_blocks"])
@pytest.mark.parametrize("name", [name for name in NORMALIZER_NAMES if name != "softmax"])
def test_key_blocks_without_weight_are_skipped_exactly(name, case, specs, monkeypatch):
    """On clustered supports (local keys and a few seen from everywhere), the sparse maps run
    their P.V and backward over the key blocks with a nonzero weight only, and the outputs and
    the gradients of query, key, value, the additive mask and the alphas are those of the
    materialized path in float64, to 1e-12 of their scale; also where each block holds one head
    (one_head_blocks), whose support map is then that head's alone."""
    normalizer = _normalizer(name)
    query, key, value, bias = _clustered_case(kv_heads=2 if case == "gqa" else H)
    if case == "one_head_blocks":  # a budget of one head's 32 queries
        monkeypatch.setitem(blocked.BLOCK_ELEMENTS, "cpu", 32 * query.shape[-2])
    position = torch.arange(query.shape[-2])
    is_causal = case == "causal"
    hidden = None  # what a mask hides beside the bias
    if case == "window":  # a sliding window of 200 keys
        hidden = (position[:, None] - position).abs() >= 200
    elif case == "masked_rows":  # queries that see no key get zeros and no gradient
        hidden = ((position >= 100) & (position < 110))[:, None].expand(-1, len(position))

    def mask():
        # Made anew for each path: its graph is freed by the first path's gradients.
        if is_causal:  # the scores alone fall with distance: no bias
            return None
        return bias if hidden is None else bias.masked_fill(hidden, float("-inf"))

    inputs = [query, key, value, *([] if is_causal else [bias]), *normalizer.parameters()]
    arguments = dict(is_causal=is_causal, enable_gqa=case == "gqa", normalizer=normalizer)
    actual = scaled_dot_product_attention(query, key, value, attn_mask=mask(), block_queries=32, **arguments)
    expected = _materialized(query, key, value, mask(), is_causal, normalizer)
    _assert_relatively_close(actual, expected, 1e-12, "output")
    for index, (got, reference) in enumerate(zip(_gradients(actual, inputs), _gradients(expected, inputs))):
        _assert_relatively_close(got, reference, 1e-12, f"gradient of input {index}")
    if not is_causal:
        # The key ranges each block's backward ran over, against the keys visible to it.
        gathered = [
            (sum(r1 - r0 for r0, r1 in runs), k1 - k0)
            for spec in specs
            for (*_, k0, k1), runs in zip(spec.blocks, spec.support)
        ]
        skipped = sum(visible - kept for kept, visible in gathered)
        assert skipped > 0.5 * sum(visible for _, visible in gathered), gathered
    if case == "one_head_blocks":
        assert all(h1 - h0 == 1 for spec in specs for _, _, h0, h1, *_ in spec.blocks)


@pytest.mark.parametrize("name", [name for name in NORMALIZER_NAMES if name != "softmax"])
def test_rows_search_their_own_candidate_key_blocks(name, monkeypatch):
    """Where every key block is a candidate of some row but each row has few, the threshold
    search runs on each row's candidate blocks gathered (the rest -inf): outputs and gradients
    of query, key, value and an additive mask (top-k then keeps its whole rows) are the
    materialized path's in float64, to 1e-12 of their scale, with a fully masked query. Top-k's
    cut depends on its (k+1)-th largest score, which a row's candidates may leave out: its rows
    are searched whole."""
    searched = []
    statistics = blocked._statistics_of_row_candidates

    def recording(*arguments):
        found = statistics(*arguments)
        searched.append(found is not None)
        return found

    monkeypatch.setattr(blocked, "_statistics_of_row_candidates", recording)
    # Learned alpha at 1.5 in every head: a head near softmax weighs every key block.
    options = {"alpha_init": 1.5} if name == "alpha_entmax" else {"topk": 5}
    normalizer = build_normalizer(name, H, **options).double()
    generator = torch.Generator().manual_seed(0)
    query = (8.0 * torch.randn(1, H, 64, 16, generator=generator, dtype=torch.float64)).requires_grad_()
    key, value = (
        torch.randn(1, H, 1000, 16, generator=generator, dtype=torch.float64).requires_grad_() for _ in range(2)
    )
    bias = torch.zeros(1, H, 64, 1000, dtype=torch.float64)
    bias[0, 0, 5] = float("-inf")  # a query that sees no key
    bias.requires_grad_()
    inputs = [query, key, value, bias, *normalizer.parameters()]
    actual = scaled_dot_product_attention(query, key, value, attn_mask=bias, block_queries=32, normalizer=normalizer)
    expected = _materialized(query, key, value, bias, False, normalizer)
    _assert_relatively_close(actual, expected, 1e-12, "output")
    for index, (got, reference) in enumerate(zip(_gradients(actual, inputs), _gradients(expected, inputs))):
        _assert_relatively_close(got, reference, 1e-12, f"gradient of input {index}")
    assert any(searched) == (name != "topk"), searched


@pytest.mark.parametrize("case", ["causal", "padding", "window", "gqa", "fixed_bias", "tied_queries"])
def test_topk_blocks_hold_the_kept_keys_alone(case, specs):
    """Top-k's blocks keep each row's k keys and their weights, and run P.V and the backward
    over those alone, with no scores recomputed: outputs and gradients are the materialized
    path's in float64, to 1e-12 of their scale, with rows that see fewer than k keys or none.
    A block where a row's k-th largest score ties with the next is normalized whole (top-k
    keeps every tied key), beside blocks that gather."""
    normalizer = _normalizer("topk")
    query, key, value, mask, is_causal = _case("bias" if case == "fixed_bias" else case, dtype=torch.float64)
    if case == "fixed_bias":
        mask = mask.detach()
    if case == "tied_queries":  # queries 16-23 score 0 on every key
        query = query.detach().clone()
        query[:, :, 16:24] = 0.0
        query.requires_grad_()
    inputs = [query, key, value]
    arguments = dict(attn_mask=mask, is_causal=is_causal, enable_gqa=case == "gqa", normalizer=normalizer)
    actual = scaled_dot_product_attention(query, key, value, block_queries=8, **arguments)
    expected = _materialized(query, key, value, mask, is_causal, normalizer)
    _assert_relatively_close(actual, expected, 1e-12, "output")
    for index, (got, reference) in enumerate(zip(_gradients(actual, inputs), _gradients(expected, inputs))):
        _assert_relatively_close(got, reference, 1e-12, f"gradient of input {index}")
    (spec,) = specs
    gathered = [support is blocked._KEPT_KEYS for support in spec.support]
    if case == "tied_queries":
        assert [q0 for (*_, q0, _, _, _), kept in zip(spec.blocks, gathered) if not kept] == [16]
    else:
        assert all(gathered)
    if case == "causal":  # query i sees i + 1 keys: the hidden ones among its k weigh exactly 0
        first = spec.kept_weights[:, :, :8]
        assert (first > 0).sum(dim=-1).tolist() == [[[min(q + 1, 5) for q in range(8)]] * H] * B


@pytest.mark.parametrize("name", [name for name in NORMALIZER_NAMES if name != "softmax"])
def test_skipping_stays_exact_on_large_float32_scores(name):
    """Scores near 1e5 in float32, whose spacing (2^-7) is coarser than any fixed margin: the
    key blocks are skipped by the forward's own arithmetic on the scores, so no key with
    weight is dropped, and the output is the materialized path's in float32."""
    normalizer = _normalizer(name)
    query, key, value, bias = _clustered_case(dtype=torch.float32)
    shifted = (bias.detach() + 1e5).requires_grad_()
    actual = scaled_dot_product_attention(query, key, value, attn_mask=shifted, block_queries=32, normalizer=normalizer)
    expected = _materialized(query, key, value, shifted, False, normalizer)
    _assert_relatively_close(actual, expected, 1e-5, "output")


def test_a_learned_alpha_module_learns_through_it():
    normalizer = build_normalizer("alpha_entmax", H, alpha_init=1.5)
    query, key, value, _, _ = _case("causal")
    scaled_dot_product_attention(query, key, value, is_causal=True, normalizer=normalizer).square().sum().backward()
    assert normalizer.alpha_logit.grad is not None and bool((normalizer.alpha_logit.grad != 0).all())


def _bad(**overrides):
    generator = torch.Generator().manual_seed(0)
    arguments = dict(
        query=torch.randn(2, 4, 5, 8, generator=generator),
        key=torch.randn(2, 4, 6, 8, generator=generator),
        value=torch.randn(2, 4, 6, 8, generator=generator),
    )
    arguments.update(overrides)
    return arguments


@pytest.mark.parametrize(
    "overrides, error, words",
    [
        (dict(key=torch.randn(2, 4, 6, 7)), ValueError, "last dim"),
        (dict(value=torch.randn(2, 4, 5, 8)), ValueError, "same heads and length"),
        (dict(key=torch.randn(3, 4, 6, 8), value=torch.randn(3, 4, 6, 8)), ValueError, "batch dims"),
        (dict(key=torch.randn(2, 2, 6, 8), value=torch.randn(2, 2, 6, 8)), ValueError, "enable_gqa=True"),
        (dict(key=torch.randn(2, 3, 6, 8), value=torch.randn(2, 3, 6, 8), enable_gqa=True), ValueError, "multiple"),
        (dict(query=torch.randn(2, 4, 5, 8).double()), TypeError, "one dtype"),
        (dict(query=torch.ones(2, 4, 5, 8, dtype=torch.long)), TypeError, "query must be a floating"),
        (dict(query=torch.randn(5, 8)), ValueError, "at least 3 dims"),
        (dict(attn_mask=torch.ones(5, 6, dtype=torch.long)), TypeError, "attn_mask must be boolean"),
        (dict(attn_mask=torch.ones(5, 7, dtype=torch.bool)), ValueError, "does not broadcast"),
        (dict(attn_mask=torch.ones(5, 6, dtype=torch.bool), is_causal=True), ValueError, "not both"),
        (dict(dropout_p=1.5), ValueError, "dropout_p"),
        (dict(scale=float("nan")), ValueError, "scale"),
        (dict(block_queries=0), ValueError, "block_queries"),
        (dict(normalizer="entmax"), ValueError, "unknown normalizer 'entmax'"),
        (dict(normalizer="alpha_entmax"), ValueError, "build_normalizer('alpha_entmax'"),
        (dict(normalizer=build_normalizer("entmax15", 2)), ValueError, "built for 2 heads"),
        (dict(normalizer=build_normalizer("topk", 4), topk=3), ValueError, "normalizer given by name"),
        (dict(normalizer=torch.nn.Softmax(dim=-1)), TypeError, "normalizer must be a name"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(overrides, error, words):
    arguments = _bad(**overrides)
    before = {name: value.clone() for name, value in arguments.items() if torch.is_tensor(value)}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        scaled_dot_product_attention(**arguments)
    for name, value in before.items():
        assert torch.equal(arguments[name], value), f"{name} was changed"
