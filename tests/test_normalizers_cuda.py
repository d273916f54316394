"""What users rely on when the normalizers run on a CUDA device: the GPU gives what the CPU
gives (outputs, gradients of the scores and of alpha, in float32 and half precision, with -inf
masks, fully masked rows and extreme scores, over inputs split into several GPU blocks);
per-head alphas that reach every branch of alpha_entmax agree with the independent float64
references within the documented bounds; masked keys get zero gradient; alpha may be given on
the CPU; and nothing synchronises the host (torch.cuda.set_sync_debug_mode("error")).

CI has no GPU: the device-independent tests run there on the CPU, on the sync-free path the
GPU takes (forced by sync_free()); the `cuda` ones skip. On a GPU machine they need only
torch, numpy and pytest (not fairseq: the suite loads the plugin only for the fairseq tests):

    python -m pytest -m cuda tests/test_normalizers_cuda.py
"""

import contextlib

import numpy as np
import pytest
import torch

from fairseq_entmax.normalizers import _common, alpha_entmax, entmax15, softmax, sparsemax, sync_free, topk_softmax
from normalizer_references import alpha_entmax_reference

# The device-independent tests: on the CPU with the GPU's (sync-free) path, and on CUDA.
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]

DEVICE = "cuda"
HEADS = 4

# name -> map(scores, alpha); alpha is one learned value per head, used by alpha_entmax only.
MAPS = {
    "softmax": lambda x, alpha: softmax(x),
    "sparsemax": lambda x, alpha: sparsemax(x),
    "entmax15": lambda x, alpha: entmax15(x),
    "alpha_entmax": lambda x, alpha: alpha_entmax(x, alpha),
    "topk_softmax": lambda x, alpha: topk_softmax(x, 3),
    # one k per row, as --topk-fraction 0.3 gives: 30% of the keys each query sees
    "topk_softmax_per_row": lambda x, alpha: topk_softmax(
        x, torch.ceil((x > float("-inf")).sum(-1, keepdim=True) * 0.3).long().clamp(min=1)
    ),
}

# Difference allowed between the devices, relative to the largest magnitude of what is compared
# (at least 1): float32 allows for another order of summation, half precision for one rounding
# of the result.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def attention_scores(batch, queries, keys, dtype, seed):
    """(batch, HEADS, queries, keys) scores of scale 3 with what attention brings: padded keys
    (-inf), a causal mask (-inf), a fully masked row, and a row of huge finite scores."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, HEADS, queries, keys, generator=generator) * 3
    scores[0, :, :, keys - keys // 4 :] = float("-inf")
    causal = torch.ones(queries, keys, dtype=torch.bool).triu(1)
    scores[-1].masked_fill_(causal, float("-inf"))
    scores[0, 0, 0] = float("-inf")
    scores[-1, -1, -1] = torch.linspace(-1.0, 1.0, keys) * (torch.finfo(dtype).max / 2)
    return scores.to(dtype)


def forward_backward(name, scores, alpha_logits, upstream):
    """p, d loss / d scores and, for alpha_entmax, d loss / d alpha_logits, on scores' device."""
    scores = scores.clone().requires_grad_()
    alpha_logits = alpha_logits.clone().requires_grad_()
    # alpha stays in float32, as SparseMultiheadAttention gives it: half precision would round it
    alpha = (1.0 + torch.sigmoid(alpha_logits)).view(1, HEADS, 1, 1)
    p = MAPS[name](scores, alpha)
    (p.float() * upstream).sum().backward()
    alpha_grad = alpha_logits.grad if name == "alpha_entmax" else None
    return p, scores.grad, alpha_grad


def assert_devices_agree(name, scores, dtype):
    generator = torch.Generator().manual_seed(1)
    alpha_logits = torch.randn(HEADS, generator=generator)
    upstream = torch.randn(scores.shape, generator=generator)
    on_cpu = forward_backward(name, scores, alpha_logits, upstream)
    on_gpu = forward_backward(name, scores.to(DEVICE), alpha_logits.to(DEVICE), upstream.to(DEVICE))
    p_gpu = on_gpu[0]
    assert p_gpu.device.type == "cuda" and p_gpu.dtype == dtype
    for what, cpu, gpu in zip(("p", "grad of scores", "grad of alpha"), on_cpu, on_gpu):
        if cpu is None:
            continue
        assert torch.isfinite(gpu).all(), f"{name}: {what} on {DEVICE} is not finite"
        difference = (gpu.cpu().float() - cpu.float()).abs().max().item()
        allowed = TOLERANCE[dtype] * max(1.0, cpu.float().abs().max().item())
        assert difference <= allowed, f"{name}, {dtype}: {what} differs by {difference:.2e} (allowed {allowed:.2e})"
    # Masked entries and the fully masked row get exactly 0 on the GPU too.
    masked = torch.isneginf(scores).to(DEVICE)
    assert torch.all(p_gpu[masked] == 0), f"{name}: a masked entry has weight on {DEVICE}"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", MAPS)
def test_cuda_agrees_with_cpu(name, dtype):
    assert_devices_agree(name, attention_scores(3, 7, 40, dtype, seed=0), dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("name", MAPS)
def test_cuda_agrees_with_cpu_across_several_gpu_blocks(name):
    """An input of more than GPU_BLOCK_ELEMENTS entries is processed in several blocks."""
    keys = 300
    queries = _common.GPU_BLOCK_ELEMENTS // (2 * HEADS * keys) + 50
    scores = attention_scores(2, queries, keys, torch.float32, seed=2)
    assert scores.numel() > _common.GPU_BLOCK_ELEMENTS
    assert_devices_agree(name, scores, torch.float32)


def on_device(device):
    """The path that device takes: the sync-free one, forced on the CPU."""
    return sync_free() if device == "cpu" else contextlib.nullcontext()


# One alpha per head reaching each branch of alpha_entmax: computed as softmax (alpha - 1 below
# 6e-5 in float32), the alpha gradient's form near 1 (below 1.005), the plain Newton search,
# and the safeguarded one (alpha > 2); with the bound the docstring states for each.
BRANCH_ALPHAS = [1.00003, 1.004, 1.5, 2.5]
BOUNDS = {torch.float32: [1.5e-4, 1.5e-4, 1e-6, 3e-6], torch.float64: [1e-8, 1e-8, 1e-13, 1e-13]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("device", DEVICES)
def test_per_head_alphas_of_every_branch_match_the_references(device, dtype):
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(2, HEADS, 6, 50, generator=generator, dtype=torch.float64) * 3
    scores[0, :, :, 40:] = float("-inf")  # padded keys
    upstream = torch.randn(scores.shape, generator=generator, dtype=torch.float64)
    alpha = torch.tensor(BRANCH_ALPHAS, dtype=torch.float64).view(1, HEADS, 1, 1)

    x = scores.to(device, dtype).clone().requires_grad_()
    alpha_on_device = alpha.to(device, dtype).clone().requires_grad_()
    with on_device(device):
        p = alpha_entmax(x, alpha_on_device)
        (p * upstream.to(device, dtype)).sum().backward()
    p = p.detach().cpu().double()
    for head, bound in enumerate(BOUNDS[dtype]):
        rows = scores[:, head].to(dtype).double().reshape(-1, 50).numpy()  # as the map was given them
        expected = np.stack([alpha_entmax_reference(row, BRANCH_ALPHAS[head]) for row in rows])
        error = np.abs(p[:, head].reshape(-1, 50).numpy() - expected).max()
        assert error <= bound, f"alpha {BRANCH_ALPHAS[head]}, {dtype}: error {error:.2e} > {bound:.0e}"
    assert torch.all(x.grad[0, :, :, 40:] == 0), "a masked key has a gradient"
    # The alpha gradient against the float64 one of the CPU's early-exit path.
    reference_alpha = alpha.clone().requires_grad_()
    (alpha_entmax(scores, reference_alpha) * upstream).sum().backward()
    torch.testing.assert_close(alpha_on_device.grad.cpu().double(), reference_alpha.grad, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_alpha_given_on_the_cpu(device):
    """alpha on the CPU, scores on the device: alpha is moved, and its gradient comes back to
    the CPU tensor."""
    scores = torch.randn(2, HEADS, 3, 7, generator=torch.Generator().manual_seed(0)).to(device).requires_grad_()
    alpha = torch.tensor([1.2, 1.4, 1.6, 1.8]).view(1, HEADS, 1, 1).requires_grad_()
    with on_device(device):
        p = alpha_entmax(scores, alpha)
        p.pow(2).sum().backward()
    assert p.device.type == device and alpha.grad.device.type == "cpu"
    assert torch.isfinite(alpha.grad).all() and alpha.grad.abs().sum() > 0


@pytest.mark.cuda
@pytest.mark.parametrize("name", MAPS)
def test_no_host_synchronisation_on_cuda(name):
    """Forward and backward of each map with CUDA's sync debug mode set to raise on any
    synchronising call (a warm-up call first: the first launch of a kernel may sync)."""
    scores = attention_scores(3, 7, 40, torch.float32, seed=0).to(DEVICE)
    alpha_logits = torch.randn(HEADS, device=DEVICE)
    upstream = torch.randn(scores.shape, device=DEVICE)
    forward_backward(name, scores, alpha_logits, upstream)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        forward_backward(name, scores, alpha_logits, upstream)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "name, options",
    [("softmax", {}), ("sparsemax", {}), ("entmax15", {}), ("alpha_entmax", {}), ("topk", {"topk": 8})]
    + [("topk", {"topk_fraction": 0.3})],
)
def test_attention_layer_normalizer_does_not_synchronise_the_host(name, options, dtype):
    """The module SparseMultiheadAttention calls on its scores (build_normalizer: learned
    alpha's per-head alphas and clamp, top-k's per-row k), in float32 and in --fp16's float16,
    under the sync debug mode after a warm-up call, with padded keys and a fully masked row."""
    from fairseq_entmax.normalizers import build_normalizer

    layer = build_normalizer(name, HEADS, **options).to(DEVICE)
    scores = torch.randn(3 * HEADS, 6, 20, generator=torch.Generator().manual_seed(0)) * 3
    scores[:HEADS, :, 15:] = float("-inf")
    scores[HEADS, 3] = float("-inf")
    scores = scores.to(DEVICE, dtype)
    upstream = torch.linspace(-1, 1, 20, device=DEVICE, dtype=dtype)

    def gradient():
        x = scores.clone().requires_grad_()
        (layer(x) * upstream).sum().backward()
        return x.grad

    gradient()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        grad = gradient()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(grad).all()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["softmax", "sparsemax", "entmax15", "alpha_entmax", "topk"])
def test_blocked_attention_on_the_gpu_gives_what_the_cpu_gives(name, dtype):
    """fairseq_entmax.attention on CUDA (the sync-free searches, GPU blocks) against the CPU:
    output and the gradients of query, key, value and the alphas, causal and padded."""
    from fairseq_entmax.attention import scaled_dot_product_attention
    from fairseq_entmax.normalizers import build_normalizer

    torch.manual_seed(0)
    normalizer = build_normalizer(name, HEADS, alpha_init="random", topk=4)
    query, key, value = (torch.randn(2, HEADS, 300, 16, dtype=dtype) * 2 for _ in range(3))
    padding = (torch.arange(300) < torch.tensor([300, 211])[:, None]).view(2, 1, 1, 300)
    results = {}
    for device in ("cpu", DEVICE):
        moved = normalizer.to(device)
        inputs = [t.to(device).requires_grad_() for t in (query, key, value)]
        for mask, causal in ((None, True), (padding.to(device), False)):
            output = scaled_dot_product_attention(*inputs, attn_mask=mask, is_causal=causal, normalizer=moved)
            grads = torch.autograd.grad(output.float().sum(), inputs + list(moved.parameters()))
            results.setdefault(device, []).append([output.float().cpu()] + [g.float().cpu() for g in grads])
    tolerance = 1e-4 if dtype == torch.float32 else 1e-2
    for cpu, gpu in zip(results["cpu"], results[DEVICE]):
        for expected, actual in zip(cpu, gpu):
            torch.testing.assert_close(actual, expected, atol=tolerance * float(expected.abs().max()), rtol=0)
