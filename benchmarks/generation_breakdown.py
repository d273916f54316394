"""Where fairseq-generate's time goes: the time spent in the attention normalizers, per
attention type, against the whole run.

Each checkpoint (a model of this package) is run through fairseq-generate in a process of its
own, with every call of an attention's normalizer module timed, and every call of the blocked
attention (fairseq_entmax.attention, which the encoder takes: it needs no weights) timed whole,
its products included, since its normalizer runs inside it block by block. Reported per checkpoint:
the run's wall time, the time inside the normalizers and its share, and the mean time of one
call for encoder self-attention, decoder self-attention and cross attention. The same
generation settings as benchmarks/training.py (beam 5, batches of 16, output forced to a
fixed length) make the runs comparable; a softmax checkpoint of this package gives the floor.
On a GPU every timed call is synchronised, which slows the run a little.

    python -m benchmarks.translation training --settings long-small --rounds 1 --work-dir /tmp/ls
    python -m benchmarks.translation breakdown /tmp/ls/long-small/bin \
        --path /tmp/ls/long-small/*_r0/checkpoint_last.pt --len 60
"""

import argparse
import contextlib
import sys
import time
from pathlib import Path

import torch

from benchmarks.fresh_process import call_in_fresh_process
from benchmarks.machine import run_record
from fairseq_entmax import USER_DIR
from fairseq_entmax.modules import sparse_multihead_attention
from fairseq_entmax.modules.sparse_multihead_attention import SparseMultiheadAttention
from fairseq_entmax.names import ATTENTION_TYPES
from fairseq_entmax.normalizers import AttentionNormalizer


def generate_command(data_bin, checkpoint, length, device):
    """fairseq-generate's command line: beam 5 on the test split, every output `length` tokens."""
    options = (
        f"--gen-subset test --beam 5 --batch-size 16 --quiet --min-len {length} --max-len-a 0 --max-len-b {length}"
    )
    on_cpu = ["--cpu", "--num-workers", "0"] if device == "cpu" else []
    return [
        "fairseq-generate",
        str(data_bin),
        "--user-dir",
        USER_DIR,
        "--path",
        str(checkpoint),
        *options.split(),
        *on_cpu,
    ]


def measure(data_bin, checkpoint, length, device):
    """Run fairseq-generate in this process with every normalizer call timed.

    Args: data_bin: the data-bin, with a test split; checkpoint: the model's checkpoint; length: the output
    length every hypothesis is forced to; device: "cpu" or "cuda".
    Returns: {"checkpoint", "normalizers" (their names), "wall_s" (fairseq-generate's wall time),
    "normalize_s" (the normalizers' total), "ms_per_call" ({attention type: mean ms, or None})}.
    """
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    calls = {kind: [] for kind in ATTENTION_TYPES}
    normalizers = set()
    # The attention type of the normalizer call under way: the attention's forward sets it.
    current = {}
    untimed_forward = SparseMultiheadAttention.forward
    untimed_call = AttentionNormalizer.__call__

    def forward_noting_its_type(self, *args, **kwargs):
        current["type"] = self.attention_type
        return untimed_forward(self, *args, **kwargs)

    def timed_call(self, scores):
        sync()
        start = time.perf_counter()
        probs = untimed_call(self, scores)
        sync()
        calls[current["type"]].append(time.perf_counter() - start)
        normalizers.add(self.name)
        return probs

    untimed_blocked = sparse_multihead_attention.scaled_dot_product_attention

    def timed_blocked(*args, normalizer, **kwargs):
        sync()
        start = time.perf_counter()
        output = untimed_blocked(*args, normalizer=normalizer, **kwargs)
        sync()
        calls[current["type"]].append(time.perf_counter() - start)
        normalizers.add(normalizer.name)
        return output

    SparseMultiheadAttention.forward = forward_noting_its_type
    AttentionNormalizer.__call__ = timed_call
    sparse_multihead_attention.scaled_dot_product_attention = timed_blocked
    sys.argv = generate_command(data_bin, checkpoint, length, device)
    # fairseq-generate's log and output to stderr: stdout is the caller's table.
    with contextlib.redirect_stdout(sys.stderr):
        from fairseq_cli import generate

        start = time.perf_counter()
        generate.cli_main()
        wall = time.perf_counter() - start
    return {
        "checkpoint": str(checkpoint),
        "normalizers": sorted(normalizers),
        "wall_s": wall,
        "normalize_s": sum(sum(times) for times in calls.values()),
        "ms_per_call": {kind: 1e3 * sum(t) / len(t) if t else None for kind, t in calls.items()},
    }


def main():
    """The benchmark's command line (see the top); prints the results table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_bin", type=Path, help="binarized data with a test split")
    parser.add_argument(
        "--path",
        type=Path,
        nargs="+",
        required=True,
        help="checkpoints of adaptively_sparse_transformer / explicit_sparse_transformer models",
    )
    parser.add_argument("--len", type=int, default=60, help="output length every hypothesis is forced to")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    missing = [str(path) for path in args.path if not path.is_file()]
    if missing:
        sys.exit(f"checkpoint not found: {', '.join(missing)}")
    run_record(args.device)
    print(
        "| checkpoint | normalizer | generate s | in normalizers s | share | "
        + " | ".join(f"{kind} ms/call" for kind in ATTENTION_TYPES)
        + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(ATTENTION_TYPES))
    for checkpoint in args.path:
        # One process per checkpoint, so that no run inherits another's warm caches.
        result = call_in_fresh_process(measure, args.data_bin, checkpoint, args.len, args.device)
        if not result["normalizers"]:
            sys.exit(f"{checkpoint}: no SparseMultiheadAttention was called; pass checkpoints of this package's models")
        per_call = " | ".join(
            "-" if result["ms_per_call"][kind] is None else f"{result['ms_per_call'][kind]:.2f}"
            for kind in ATTENTION_TYPES
        )
        print(
            f"| {checkpoint.parent.name} | {', '.join(result['normalizers'])} | {result['wall_s']:.2f} | "
            f"{result['normalize_s']:.2f} | {result['normalize_s'] / result['wall_s']:.0%} | {per_call} |",
            flush=True,
        )
