"""Whether the attention layer's normalizer step synchronises the host with the GPU.

Forward and backward of the module SparseMultiheadAttention calls on its scores
(fairseq_entmax.normalizers.build_normalizer: learned alpha's per-head alphas and clamp, top-k's
per-row k) for every normalizer, in float32 and in float16 (fairseq's --fp16), after one
warm-up call (a kernel's first launch may synchronise), under
torch.cuda.set_sync_debug_mode("error"), which raises on any synchronising call. On the CPU the
step runs on the sync-free path and nothing is checked. The GPU check (benchmarks.gpu_check)
runs it in a process of its own, so that a CUDA error cannot touch its other steps.

    python -m benchmarks.attention_sync --device cuda --json attention-sync.json
"""

import argparse
import json
from pathlib import Path

import torch

from fairseq_entmax.normalizers import build_normalizer, sync_free

# The attention layer's normalizers, as build_normalizer names them, with their options.
LAYER_NORMALIZERS = [
    ("softmax", {}),
    ("sparsemax", {}),
    ("entmax15", {}),
    ("alpha_entmax", {}),
    ("topk", {"topk": 8}),
    ("topk", {"topk_fraction": 0.3}),
]
NO_SYNC = "no host sync"
CPU_RAN = "ran (the CPU cannot check synchronisation)"


def verdict_of(normalizer, options, dtype, device):
    """One case: forward and backward of one normalizer module in one dtype.

    Args:
        normalizer: a build_normalizer name.
        options: its keyword options.
        dtype: torch.float32 or torch.float16.
        device: "cuda" or "cpu".

    Returns:
        NO_SYNC, CPU_RAN, or what went wrong, one line.
    """
    heads, queries, keys = 4, 6, 20
    layer = build_normalizer(normalizer, heads, **options).to(device)
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(3 * heads, queries, keys, generator=generator) * 3
    scores[:heads, :, 15:] = float("-inf")  # padded keys
    scores[heads, 3] = float("-inf")  # a fully masked row
    scores = scores.to(device, dtype)
    upstream = torch.linspace(-1, 1, keys, device=device, dtype=dtype)

    def forward_backward():
        x = scores.clone().requires_grad_()
        (layer(x) * upstream).sum().backward()
        return x.grad

    if device == "cuda":
        forward_backward()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            grad = forward_backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        verdict = NO_SYNC
    else:
        with sync_free():
            grad = forward_backward()
        verdict = CPU_RAN
    return verdict if torch.isfinite(grad).all() else "the gradient is not finite"


def main(argv=None):
    """The command line (see the top): writes {case: verdict} to --json as each case ends."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--json", type=Path, required=True, help="the file the verdicts are written to")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available to torch")
    verdicts = {}
    for dtype in (torch.float32, torch.float16):
        for normalizer, options in LAYER_NORMALIZERS:
            case = f"{normalizer} {json.dumps(options)} {str(dtype).replace('torch.', '')}"
            try:
                verdicts[case] = verdict_of(normalizer, options, dtype, args.device)
            except Exception as error:  # recorded, and the next case runs
                verdicts[case] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
            args.json.write_text(json.dumps(verdicts, indent=1) + "\n")
            print(f"{case}: {verdicts[case]}", flush=True)


if __name__ == "__main__":
    main()
