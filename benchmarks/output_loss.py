"""Forward+backward time and peak memory of the output layer's losses, side by side.

Compares, on (tokens, vocabulary) scores, standard normal times 3, one random target per token:
  fairseq's label-smoothed cross-entropy (label_smoothed_nll_loss on log_softmax, as the
  label_smoothed_cross_entropy criterion computes it: the baseline), this package's entmax
  losses (fenchel_young_loss, what the entmax_loss criterion computes) at alpha = 1, 1.5, 2 and
  1.3, and the entmax package's losses with their defaults (Entmax15Loss: partial sort of
  k = 100; SparsemaxLoss: full sort; EntmaxBisectLoss: 50 bisection steps).

Each measurement is the forward of the summed loss and its backward. Timing, rounds and
memory as in benchmarks/normalizers.py, whose helpers this reuses: every method once per
round, in an order shuffled per round, medians reported; peak memory is what one
forward+backward adds to the process at its peak (the gradient, the probabilities kept for
the backward and every temporary).

Run:  python -m benchmarks.maps losses [--rounds N] [--shapes 4096x8000 ...] [--threads N]
"""

import argparse
import functools
import sys

import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

# the normalizer benchmark's timing and memory measures
from benchmarks.machine import run_record
from benchmarks.normalizers import cpu_memory_setup, machine_description, median_times, peak_memory, time_once
from fairseq_entmax.losses import fenchel_young_loss

try:
    from entmax.losses import Entmax15Loss, EntmaxBisectLoss, SparsemaxLoss
except ImportError:  # the package rows are left out
    Entmax15Loss = None

SHAPES = [(4096, 8000), (4096, 32000)]
LABEL_SMOOTHING = 0.1
BASELINE = "fairseq label_smoothed_nll_loss (log_softmax)"


def fairseq_cross_entropy(logits, target):
    lprobs = torch.log_softmax(logits.float(), dim=-1)
    loss, _ = label_smoothed_nll_loss(lprobs, target, LABEL_SMOOTHING, ignore_index=None, reduce=True)
    return loss


def ours(alpha, label_smoothing):
    return lambda logits, target: fenchel_young_loss(logits, target, alpha, label_smoothing).loss.sum()


def package(loss):
    return lambda logits, target: loss(logits, target)


def methods():
    """(name, alpha, fn(logits, target) -> scalar loss); ours at alpha > 1 without smoothing, as the package
    (which has none) computes them.
    """
    entries = [
        (BASELINE + f", eps {LABEL_SMOOTHING}", 1.0, fairseq_cross_entropy),
        (f"ours, alpha 1, eps {LABEL_SMOOTHING}", 1.0, ours(1.0, LABEL_SMOOTHING)),
    ]
    package_losses = {}
    if Entmax15Loss is not None:
        package_losses = {
            1.5: ("entmax Entmax15Loss (k=100)", Entmax15Loss(reduction="sum")),
            2.0: ("entmax SparsemaxLoss", SparsemaxLoss(reduction="sum")),
            1.3: ("entmax EntmaxBisectLoss (n_iter=50)", EntmaxBisectLoss(alpha=1.3, reduction="sum")),
        }
    for alpha in (1.5, 2.0, 1.3):
        entries.append((f"ours, alpha {alpha}", alpha, ours(alpha, 0.0)))
        if alpha in package_losses:
            name, loss = package_losses[alpha]
            entries.append((name, alpha, package(loss)))
    return entries


def shape_inputs(shape):
    torch.manual_seed(0)
    logits = (torch.randn(*shape) * 3).requires_grad_()
    target = torch.randint(0, shape[1], (shape[0],))
    return logits, target, torch.tensor(1.0)


def measure_shape(shape, rounds):
    """Median milliseconds, peak MiB and loss per method; memory is measured after every timing of the shape (see
    benchmarks/normalizers.py: the allocator settings it needs would slow the timing).
    """
    logits, target, upstream = shape_inputs(shape)
    entries = methods()
    timers = {
        name: functools.partial(time_once, fn, logits, target, upstream, logits.device) for name, _, fn in entries
    }
    with torch.no_grad():
        losses = {name: fn(logits, target).item() for name, _, fn in entries}
    return {name: seconds * 1e3 for name, seconds in median_times(timers, rounds, shape).items()}, losses


def memory_shape(shape, release_free_memory):
    logits, target, upstream = shape_inputs(shape)
    memory = {}
    for name, _, fn in methods():
        time_once(fn, logits, target, upstream, logits.device)  # allocator warm-up
        memory[name] = peak_memory(fn, logits, target, upstream, logits.device, release_free_memory) / 2**20
    return memory


def format_table(results):
    header = (
        "| tokens x vocab | loss | ms | / fairseq's | / package's | peak MiB | / fairseq's | loss per token |"
        " vs package |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for shape, (times, memory, losses) in results.items():
        entries = methods()
        baseline = entries[0][0]
        package_of = {alpha: name for name, alpha, _ in entries if name.startswith("entmax ")}
        for name, alpha, _ in entries:
            counterpart = package_of.get(alpha) if name.startswith("ours") and alpha != 1.0 else None
            row = [
                "x".join(map(str, shape)),
                name,
                f"{times[name]:.0f}",
                f"{times[name] / times[baseline]:.2f}",
                f"{times[name] / times[counterpart]:.2f}" if counterpart else "-",
                f"{memory[name]:.0f}" if memory else "-",
                f"{memory[name] / memory[baseline]:.2f}" if memory else "-",
                f"{losses[name] / shape[0]:.4f}",
                f"{abs(losses[name] - losses[counterpart]) / abs(losses[counterpart]):.1e}" if counterpart else "-",
            ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--shapes", nargs="*", default=None, help="e.g. 4096x8000 (default: 4096x8000 4096x32000)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory columns")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    if any(len(shape) != 2 or shape[1] < 2 for shape in shapes):
        parser.error("give each shape as TOKENSxVOCAB, with a vocabulary of at least 2")
    if Entmax15Loss is None:
        print("note: the entmax package is not installed; its rows are left out", file=sys.stderr)
    timings = {shape: measure_shape(shape, args.rounds) for shape in shapes}
    memory = {}
    if not args.no_memory:
        release_free_memory = cpu_memory_setup()
        memory = {shape: memory_shape(shape, release_free_memory) for shape in shapes}
    results = {shape: (times, memory.get(shape, {}), losses) for shape, (times, losses) in timings.items()}
    run_record(machine=machine_description(torch.device("cpu")))
    print(
        f"forward+backward of the summed loss, float32 CPU, median of {args.rounds} rounds; "
        "ratios < 1 mean faster or smaller"
    )
    print(format_table(results))
