"""The normalizers on a CUDA device give what they give on the CPU: outputs, gradients of the
scores and of alpha, in float32 and half precision, with -inf masks, fully masked rows and
extreme scores, and over inputs large enough to be split into several GPU blocks.

CI has no GPU: these tests skip there. On a GPU machine they need only torch and pytest (not
fairseq, nor this suite's fairseq fixtures):

    PYTHONPATH=. python -m pytest --noconftest tests/test_normalizers_cuda.py
"""
import pytest
import torch

from fairseq_entmax.normalizers import _common, alpha_entmax, entmax15, softmax, sparsemax, topk_softmax

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device; CI has none (run it on a GPU machine)"
)

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
    scores[0, :, :, keys - keys // 4:] = float("-inf")
    causal = torch.ones(queries, keys, dtype=torch.bool).triu(1)
    scores[-1].masked_fill_(causal, float("-inf"))
    scores[0, 0, 0] = float("-inf")
    scores[-1, -1, -1] = torch.linspace(-1.0, 1.0, keys) * (torch.finfo(dtype).max / 2)
    return scores.to(dtype)


def forward_backward(name, scores, alpha_logits, upstream):
    """p, d loss / d scores and, for alpha_entmax, d loss / d alpha_logits, on scores' device."""
    scores = scores.clone().requires_grad_()
    alpha_logits = alpha_logits.clone().requires_grad_()
    alpha = (1.0 + torch.sigmoid(alpha_logits)).view(1, HEADS, 1, 1).to(scores.dtype)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", MAPS)
def test_cuda_agrees_with_cpu(name, dtype):
    assert_devices_agree(name, attention_scores(3, 7, 40, dtype, seed=0), dtype)


@pytest.mark.parametrize("name", MAPS)
def test_cuda_agrees_with_cpu_across_several_gpu_blocks(name):
    """An input of more than GPU_BLOCK_ELEMENTS entries is processed in several blocks."""
    keys = 300
    queries = _common.GPU_BLOCK_ELEMENTS // (2 * HEADS * keys) + 50
    scores = attention_scores(2, queries, keys, torch.float32, seed=2)
    assert scores.numel() > _common.GPU_BLOCK_ELEMENTS
    assert_devices_agree(name, scores, torch.float32)
