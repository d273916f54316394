"""Forward+backward time of the drop-in (fairseq_entmax.entmax) against the entmax package, side by
side, for every function the two have in common.

Each measurement is one forward and one backward: of the map's output against a fixed upstream
gradient, or of the summed loss. The maps run on attention-like scores (standard normal times 2,
4,096 rows of 512 keys), the losses on output-layer scores (512 tokens, a vocabulary of 8,000,
standard normal times 3, one random target each); a learned alpha is one per row, 1 + sigmoid(a),
a requiring grad. For each function, the package and the drop-in run once per round, in an order
shuffled per round, and the median over the rounds is reported, so that a busy machine slows both
alike; "speed-up" is the package's
median over the drop-in's. "max |diff|" is the largest difference of the outputs (the package's
bisection runs its default 50 steps).

Run:  python -m benchmarks.maps dropin [--rounds N] [--threads N]
"""

import argparse
import functools
import sys
import time

import torch

from benchmarks.machine import run_record
from benchmarks.normalizers import machine_description, median_times
from fairseq_entmax import entmax as dropin

try:
    import entmax as package
except ImportError:
    package = None

MAP_SHAPE = (4096, 512)
LOSS_SHAPE = (512, 8000)


def _learned_alpha(rows):
    logits = torch.randn(rows, 1, generator=torch.Generator().manual_seed(1))
    return logits.requires_grad_()


def cases():
    """(name, kind, call): call(module, x, target, alpha_logits) -> output, kind "map" or "loss"."""
    return [
        ("sparsemax", "map", lambda m, x, t, a: m.sparsemax(x)),
        ("entmax15", "map", lambda m, x, t, a: m.entmax15(x)),
        ("Entmax15(k=64)", "map", lambda m, x, t, a: m.Entmax15(k=64)(x)),
        ("sparsemax_bisect", "map", lambda m, x, t, a: m.sparsemax_bisect(x)),
        ("entmax_bisect, alpha 1.3", "map", lambda m, x, t, a: m.entmax_bisect(x, 1.3)),
        ("entmax_bisect, alpha 0.5", "map", lambda m, x, t, a: m.entmax_bisect(x, 0.5)),
        ("entmax_bisect, learned alpha", "map", lambda m, x, t, a: m.entmax_bisect(x, 1 + torch.sigmoid(a))),
        ("normmax_bisect, alpha 2", "map", lambda m, x, t, a: m.normmax_bisect(x, 2)),
        ("normmax_bisect, alpha 3", "map", lambda m, x, t, a: m.normmax_bisect(x, 3.0)),
        ("budget_bisect, budget 4", "map", lambda m, x, t, a: m.budget_bisect(x, 4)),
        ("sparsemax_loss", "loss", lambda m, x, t, a: m.sparsemax_loss(x, t)),
        ("Entmax15Loss (k=100)", "loss", lambda m, x, t, a: m.Entmax15Loss(reduction="none")(x, t)),
        ("sparsemax_bisect_loss", "loss", lambda m, x, t, a: m.sparsemax_bisect_loss(x, t)),
        ("entmax_bisect_loss, alpha 1.3", "loss", lambda m, x, t, a: m.entmax_bisect_loss(x, t, 1.3)),
        ("normmax_bisect_loss, alpha 2", "loss", lambda m, x, t, a: m.normmax_bisect_loss(x, t, 2)),
    ]


def inputs(kind):
    """Scores, targets, learned-alpha logits and the upstream gradient of a map's output."""
    shape = MAP_SHAPE if kind == "map" else LOSS_SHAPE
    generator = torch.Generator().manual_seed(0)
    scores = torch.randn(*shape, generator=generator) * (2.0 if kind == "map" else 3.0)
    target = torch.randint(0, shape[1], (shape[0],), generator=generator)
    upstream = torch.randn(*shape, generator=generator)
    return scores, target, _learned_alpha(shape[0]), upstream


def forward_backward(call, module, scores, target, alpha_logits, upstream):
    """One forward and backward; returns the wall time in seconds and the output."""
    x = scores.detach().requires_grad_()
    a = alpha_logits.detach().requires_grad_()
    start = time.perf_counter()
    out = call(module, x, target, a)
    if out.dim() == 1:  # a loss per row
        out.sum().backward()
    else:
        out.backward(upstream)
    return time.perf_counter() - start, out.detach()


def measure(rounds):
    """{name: (package median s, drop-in median s, max |diff| of the outputs)}."""
    results = {}
    for name, kind, call in cases():
        scores, target, alpha_logits, upstream = inputs(kind)
        runs = {
            key: functools.partial(forward_backward, call, module, scores, target, alpha_logits, upstream)
            for key, module in (("package", package), ("dropin", dropin))
        }
        times = median_times({key: lambda run=run: run()[0] for key, run in runs.items()}, rounds, name)
        difference = (runs["package"]()[1].double() - runs["dropin"]()[1].double()).abs().max().item()
        results[name] = (times["package"], times["dropin"], difference)
    return results


def format_table(results):
    lines = [
        "| function | scores | package ms | drop-in ms | speed-up | max abs diff |",
        "|---|---|---|---|---|---|",
    ]
    kinds = {name: kind for name, kind, _ in cases()}
    for name, (theirs, ours, difference) in results.items():
        shape = "x".join(map(str, MAP_SHAPE if kinds[name] == "map" else LOSS_SHAPE))
        lines.append(
            f"| {name} | {shape} | {theirs * 1e3:.1f} | {ours * 1e3:.1f} | {theirs / ours:.1f} | {difference:.1e} |"
        )
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every method (default: 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads (default: 1)")
    args = parser.parse_args()
    if package is None:
        sys.exit("the entmax package is not installed (the test extra, `make setup`): nothing to compare with")
    torch.set_num_threads(args.threads)
    results = measure(args.rounds)
    run_record(machine=machine_description(torch.device("cpu")))
    print(format_table(results))
