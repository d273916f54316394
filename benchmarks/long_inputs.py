"""Peak memory of a forward+backward on a 1,024-token input, each normalizer against softmax,
side by side in one run.

Two settings:
  layer  one encoder self-attention layer (SparseMultiheadAttention, d=512, 8 heads, as
         in Transformer base) on 4 sequences of 1,024 tokens;
  model  a small adaptively_sparse_transformer (2+2 layers, d=128, 8 heads, the long-small
         setting of benchmarks/training.py) on 2 pairs of 1,024-token source and target,
         every attention with the normalizer, cross-entropy loss.
Each runs with every normalizer (softmax, sparsemax, entmax15, alpha_entmax with alpha
learned per head, topk with k = 8) through this package's attention, and with fairseq's own
attention (MultiheadAttention / the `transformer` architecture) as a reference: there fairseq
hands self-attention to PyTorch's fused attention (F.multi_head_attention_forward, which
without attention weights calls scaled_dot_product_attention), while this package's attention
runs fairseq_entmax.attention, which works in blocks of queries and never holds the
(batch * heads, queries, keys) scores (the decoder's last cross-attention, whose weights
fairseq returns, holds them in both).

Every measurement is a fresh process (benchmarks/fresh_process.py), so that nothing one
normalizer allocated is counted for another; the processes are interleaved over rounds
(A, B, C, ..., A, B, C, ...) and the median is kept.
  peak MiB    what the forward+backward added to the process' memory at its peak: on CPU
              the peak resident set size (getrusage ru_maxrss) minus the resident size just
              before it, the first pass of the process, with the C allocator set to serve
              every block over 64 KiB by mmap and return it on free (as in
              benchmarks/normalizers.py), so that the resident size follows live tensors; on
              CUDA torch.cuda.max_memory_allocated minus memory_allocated before.
  process MiB the process' whole peak resident set (ru_maxrss): Python, torch, fairseq, the
              parameters and the inputs included (CPU only).
The inputs are random (token ids, or N(0, 1) states for the layer), the parameters
fairseq's initialisation: the attention is that of an untrained model. The memory of these
normalizers does not depend on how sparse their output is. Time is not measured here: the
allocator setting makes every large allocation fault its pages in, which slows a pass by
more than the normalizers differ (benchmarks/normalizers.py and benchmarks/training.py time
them).

    python -m benchmarks.translation long-inputs                      # CPU, both settings
    python -m benchmarks.translation long-inputs --device cuda        # on a GPU
    python -m benchmarks.translation long-inputs --settings layer --rounds 1   # quick look
"""

import argparse
import re
import resource
import statistics
import sys

from benchmarks.fresh_process import call_in_fresh_process
from fairseq_entmax.names import NORMALIZER_NAMES

# The rows of a table: (label, normalizer or None for fairseq's own attention). The ratios
# are to the first two rows.
ROWS = [("fairseq's MultiheadAttention (softmax)", None)] + [(name, name) for name in NORMALIZER_NAMES]
TOKENS = 1024
SETTINGS = {
    "layer": dict(
        batch=4, embed_dim=512, heads=8, about="one encoder self-attention layer, d=512, 8 heads, 4 x 1,024 tokens"
    ),
    "model": dict(
        batch=2,
        vocab=1000,
        size=(
            "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 128 --decoder-embed-dim 128 "
            "--encoder-ffn-embed-dim 256 --decoder-ffn-embed-dim 256 --encoder-attention-heads 8 "
            "--decoder-attention-heads 8 --share-all-embeddings --dropout 0"
        ).split(),
        about="adaptively_sparse_transformer 2+2 layers, d=128, 8 heads, 2 pairs of 1,024 + 1,024 "
        "tokens, cross-entropy loss",
    ),
}


def rss_kib():
    """This process's resident set size.

    Returns: VmRSS, KiB.
    """
    with open("/proc/self/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+)", f.read(), flags=re.M).group(1))


def cpu_allocator_follows_tensors():
    """glibc: blocks over 64 KiB by mmap, returned on free (benchmarks/normalizers.py does the same), so the
    resident size is what live tensors hold, not freed memory kept.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    libc.mallopt(-3, 64 * 1024)  # M_MMAP_THRESHOLD
    libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD


def layer_step(normalizer, device, setting):
    """One encoder self-attention layer and its inputs, ready to step.

    Args: normalizer: the --attention-normalizer, or None: fairseq's own attention; device: a torch.device;
    setting: an entry of SETTINGS.
    Returns: A function of no arguments running one forward+backward of the layer.
    """
    import torch
    from fairseq.modules import MultiheadAttention

    from fairseq_entmax.modules import SparseMultiheadAttention
    from fairseq_entmax.normalizers import build_normalizer

    torch.manual_seed(0)
    dim, heads = setting["embed_dim"], setting["heads"]
    if normalizer is None:
        layer = MultiheadAttention(dim, heads, self_attention=True)
    else:
        layer = SparseMultiheadAttention(
            dim,
            heads,
            attention_type="encoder_self",
            normalizer=build_normalizer(normalizer, heads),
            self_attention=True,
        )
    layer = layer.to(device).train()
    x = torch.randn(TOKENS, setting["batch"], dim, device=device, requires_grad=True)
    upstream = torch.randn(TOKENS, setting["batch"], dim, device=device)

    def step():
        x.grad = None
        layer.zero_grad(set_to_none=True)
        out, _ = layer(x, x, x, need_weights=False)
        out.backward(upstream)

    return step


def model_step(normalizer, device, setting):
    """The small model and a random batch, ready to step.

    Args: normalizer: the --attention-normalizer, or None: fairseq's own attention; device: a torch.device;
    setting: an entry of SETTINGS.
    Returns: A function of no arguments running one forward+backward of the model.
    """
    from types import SimpleNamespace

    import torch
    from fairseq import models, options
    from fairseq.data import Dictionary

    from fairseq_entmax import USER_DIR

    arch = (
        ["--arch", "transformer"]
        if normalizer is None
        else ["--arch", "adaptively_sparse_transformer", "--attention-normalizer", normalizer]
    )
    args = options.parse_args_and_arch(
        options.get_training_parser(),
        ["unused-data-dir", "--user-dir", USER_DIR, "--task", "translation", *arch, *setting["size"]]
        + "--max-source-positions 2048 --max-target-positions 2048".split(),
    )
    dictionary = Dictionary()
    for i in range(setting["vocab"] - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    torch.manual_seed(0)
    model = models.ARCH_MODEL_REGISTRY[args.arch].build_model(args, task).to(device).train()
    batch = setting["batch"]
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (3, batch, TOKENS), device=device)
    source, previous, target = tokens
    lengths = torch.full((batch,), TOKENS, device=device)

    def step():
        model.zero_grad(set_to_none=True)
        logits, _ = model(source, lengths, previous)
        torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), target.reshape(-1)).backward()

    return step


def worker(setting_name, normalizer, device_name, threads):
    """Measure one (setting, normalizer) in this process, its first pass.

    Args: setting_name: a key of SETTINGS; normalizer: the --attention-normalizer, or None: fairseq's own
    attention; device_name: "cpu" or "cuda"; threads: torch's threads (None: torch's choice).
    Returns: {"peak_mib", "process_mib" (None on a GPU)}.
    """
    device_is_cuda = device_name == "cuda"
    if not device_is_cuda:
        cpu_allocator_follows_tensors()
    import torch

    if threads:
        torch.set_num_threads(threads)
    device = torch.device(device_name)
    step = (layer_step if setting_name == "layer" else model_step)(normalizer, device, SETTINGS[setting_name])
    if device_is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        process_peak = None
    else:
        before = rss_kib() * 1024
        step()
        process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peak = process_peak - before
    return {"peak_mib": peak / 2**20, "process_mib": process_peak and process_peak / 2**20}


def measure(setting_name, normalizer, args):
    """Measure one (setting, normalizer) in a fresh process (worker), so that no measurement sees another's
    memory.

    Args: setting_name: a key of SETTINGS; normalizer: the --attention-normalizer, or None: fairseq's own
    attention; args: the command line (device, threads).
    Returns: The worker's {"peak_mib", "process_mib"}.
    """
    return call_in_fresh_process(worker, setting_name, normalizer, args.device, args.threads)


def table(results, device):
    """One setting's results table.

    Args: results: {row label of ROWS: {"peak_mib", "process_mib"}}; device: "cpu" or "cuda" (the process
    column is the CPU's only).
    Returns: A Markdown table.
    """
    cpu = device == "cpu"
    lines = [
        "| attention | peak MiB | / fairseq's | / softmax |" + (" process MiB |" if cpu else ""),
        "|---|---|---|---|" + ("---|" if cpu else ""),
    ]
    fairseq, softmax = results[ROWS[0][0]]["peak_mib"], results["softmax"]["peak_mib"]
    for label, _ in ROWS:
        peak = results[label]["peak_mib"]
        row = [label, f"{peak:.0f}", f"{peak / fairseq:.2f}", f"{peak / softmax:.2f}"]
        if cpu:
            row.append(f"{results[label]['process_mib']:.0f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    """The benchmark's command line (see the top); prints the results tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=3, help="processes per measurement, interleaved; median kept")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    from benchmarks.machine import run_record  # torch in this process only for the report

    run_record(args.device)
    for setting_name in args.settings:
        runs = {label: [] for label, _ in ROWS}
        for round_ in range(args.rounds):
            for label, normalizer in ROWS:
                runs[label].append(measure(setting_name, normalizer, args))
                print(
                    f"[{setting_name} round {round_ + 1}/{args.rounds}] {label}: {runs[label][-1]}",
                    file=sys.stderr,
                    flush=True,
                )
        results = {
            label: {key: (statistics.median(r[key] for r in rs) if rs[0][key] is not None else None) for key in rs[0]}
            for label, rs in runs.items()
        }
        print(
            f"\n### {setting_name}: {SETTINGS[setting_name]['about']}; forward+backward, float32, "
            f"{args.device}; median of {args.rounds} processes\n"
        )
        print(table(results, args.device), flush=True)
