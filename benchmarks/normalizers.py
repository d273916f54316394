"""Forward+backward time and peak memory of the attention normalizers, side by side.

Compares, on attention-shaped scores (batch * heads, queries, keys):
  torch.softmax (the baseline), this package's softmax, sparsemax, entmax15, alpha_entmax
  (alpha learned per head: 8 heads, alpha = 1 + sigmoid(a), a requiring grad) and
  topk_softmax (k = 8), against the entmax package's sparsemax, entmax15 and entmax_bisect
  (default n_iter=50, same learned alpha).

Each measurement is one forward and one backward (with a fixed upstream gradient). The
methods are timed round-robin (every method once per round, several rounds) and the median
is reported, so that a busy machine slows all of them alike. Peak memory is the largest
amount of memory held during one forward+backward beyond the scores and the upstream
gradient: the result, the gradient of the scores and all temporaries (CPU: peak resident
set size, reset before each call; CUDA: max_memory_allocated).

--path chooses which of our paths is measured: early-exit (the CPU's default), sync-free (what
a GPU runs, forced on the CPU) or compiled (the sync-free path through torch.compile, as
--compile-normalizers runs it; compiled once per shape during the warm-up, not timed).

--dtype gives the scores (and the upstream gradient) a precision: float32 (the default),
bfloat16 or float16, as attention under fairseq's --bf16 or --fp16 gives them. The learned
alpha stays float32, as SparseMultiheadAttention gives it. --clock cpu times the process's CPU
time instead of the wall time: at --threads 1, steady on a machine that other jobs share.
--json also writes every figure to a file.

Run:  python -m benchmarks.maps normalizers [--device cuda] [--rounds N] [--shapes 32x512x512 ...]
          [--path {early-exit,sync-free,compiled}] [--dtype {float32,bfloat16,float16}] [--json FILE]
          [--ours-only] [--no-memory] [--clock {wall,cpu}]
"""

import argparse
import functools
import json
import random
import statistics
import sys
import time

import torch

from benchmarks.machine import describe, run_record
from fairseq_entmax.normalizers import alpha_entmax, entmax15, softmax, sparsemax, sync_free, topk_softmax

try:
    import entmax as entmax_package
except ImportError:  # the comparison columns are left empty
    entmax_package = None

SHAPES = [(512, 32, 32), (128, 128, 128), (32, 512, 512), (8, 1024, 1024)]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
HEADS = 8
TOPK = 8


def learned_alpha(logits, batch_heads):
    """The learned alpha of attention, one per head, for each row of a batch of heads.

    Args: logits: one logit a per head, (HEADS,); batch_heads: the scores' first dimension, batch * HEADS.
    Returns: alpha = 1 + sigmoid(a), a (batch_heads, 1, 1) tensor.
    """
    alpha = 1.0 + torch.sigmoid(logits)
    return alpha.repeat(batch_heads // HEADS).view(batch_heads, 1, 1)


def torch_softmax(x, alpha_logits):
    """The baseline, torch.softmax over the last dimension (alpha_logits is ignored).

    Args: x: the scores; alpha_logits: unused; every method takes it.
    Returns: The probabilities.
    """
    return torch.softmax(x, -1)


def _on_sync_free_path(fn):
    """fn run with the sync-free path forced."""

    @functools.wraps(fn)
    def wrapped(*args):
        with sync_free():
            return fn(*args)

    return wrapped


PATHS = {
    "early-exit": lambda fn: fn,
    "sync-free": _on_sync_free_path,
    "compiled": lambda fn: torch.compile(fn, fullgraph=True),
}


@functools.cache
def methods(path="early-exit"):
    """The methods measured. torch.softmax is one function, timed once, in both of its places. Cached: a compiled
    function is compiled once.

    Args: path: which of our paths (a key of PATHS).
    Returns: A list of (name, ours, package counterpart or None), each function fn(scores, alpha_logits) ->
    probabilities.
    """
    pkg = entmax_package
    ours = PATHS[path]
    return [
        ("torch.softmax", torch_softmax, None),
        ("softmax", ours(lambda x, a: softmax(x, -1)), torch_softmax),
        ("sparsemax", ours(lambda x, a: sparsemax(x, -1)), pkg and (lambda x, a: pkg.sparsemax(x, -1))),
        ("entmax15", ours(lambda x, a: entmax15(x, -1)), pkg and (lambda x, a: pkg.entmax15(x, -1))),
        (
            "alpha_entmax (learned, per head)",
            # max_alpha: 1 + sigmoid(a) <= 2, the bound SparseMultiheadAttention passes
            ours(lambda x, a: alpha_entmax(x, learned_alpha(a, x.shape[0]), -1, max_alpha=2.0)),
            pkg and (lambda x, a: pkg.entmax_bisect(x, learned_alpha(a, x.shape[0]), -1)),
        ),
        (f"topk_softmax (k={TOPK})", ours(lambda x, a: topk_softmax(x, TOPK, -1)), None),
    ]


def forward_backward(fn, scores, alpha_logits, upstream):
    """One forward and backward of a method, the previous gradients cleared first.

    Args: fn: a method's function, fn(scores, alpha_logits) -> probabilities; scores: the scores, requiring
    grad; alpha_logits: one alpha logit per head, requiring grad (for alpha_entmax); upstream: the gradient of
    the output.
    """
    scores.grad = None
    alpha_logits.grad = None
    fn(scores, alpha_logits).backward(upstream)


def synchronize(device):
    """Wait for the GPU's queued work (nothing on the CPU).

    Args: device: a torch.device.
    """
    if device.type == "cuda":
        torch.cuda.synchronize()


# The clocks --clock chooses from. The process's CPU time (all its threads) is what a method
# costs the machine whatever else runs on it; at one thread it is steady on a shared machine,
# where the wall time is not.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_once(fn, scores, alpha_logits, upstream, device, clock=time.perf_counter):
    """Time one forward and backward.

    Args: fn: a method's function, fn(scores, alpha_logits) -> probabilities; scores: the scores, requiring
    grad; alpha_logits: one alpha logit per head, requiring grad (for alpha_entmax); upstream: the gradient of
    the output; device: the torch.device they are on; clock: a value of CLOCKS.
    Returns: The time in seconds.
    """
    synchronize(device)
    start = clock()
    forward_backward(fn, scores, alpha_logits, upstream)
    synchronize(device)
    return clock() - start


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def cpu_memory_setup():
    """Make the resident set size follow live tensors: glibc serves every block over 64 KiB by mmap and returns
    it on free (it would otherwise keep freed heap pages). The settings alone do not hand back the free heap
    memory already held (memory freed after the timing phase would otherwise be reused unseen), hence the
    function returned.

    Returns: A function of no arguments that hands the free heap memory back to the system.
    """
    import ctypes

    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 64 * 1024)
    libc.mallopt(m_trim_threshold, 128 * 1024)
    return lambda: libc.malloc_trim(0)


def peak_memory(fn, scores, alpha_logits, upstream, device, release_free_memory=None):
    """Peak bytes held during one forward+backward beyond what was held before it: the output, the gradient of
    the scores and every temporary.

    CUDA: torch.cuda.max_memory_allocated. CPU: the peak resident set size (VmHWM, reset through
    /proc/self/clear_refs) minus the resident size before the call, after the free heap memory is handed back.

    Args: fn: a method's function, fn(scores, alpha_logits) -> probabilities; scores: the scores, requiring
    grad; alpha_logits: one alpha logit per head, requiring grad (for alpha_entmax); upstream: the gradient of
    the output; device: the torch.device they are on; release_free_memory: on the CPU, the function
    cpu_memory_setup returns.
    Returns: The peak, in bytes.
    """
    # The gradient of the previous call is freed first, so the new one is counted.
    scores.grad = None
    alpha_logits.grad = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward_backward(fn, scores, alpha_logits, upstream)
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - base
    release_free_memory()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = _rss_kib("VmRSS")
    forward_backward(fn, scores, alpha_logits, upstream)
    return (_rss_kib("VmHWM") - before) * 1024


def shape_inputs(shape, device, dtype=torch.float32):
    """The inputs of a shape, the same on every call.

    Args: shape: (batch * heads, queries, keys); device: where they are made; dtype: the scores' and the
    upstream gradient's (alpha_logits stay float32).
    Returns: (scores, alpha_logits, upstream): random normal, the first two requiring grad.
    """
    torch.manual_seed(0)
    scores = torch.randn(*shape, device=device).to(dtype).requires_grad_()
    upstream = torch.randn(*shape, device=device).to(dtype)
    alpha_logits = torch.randn(HEADS, device=device).requires_grad_()
    return scores, alpha_logits, upstream


def method_entries(path):
    """Every function to measure, each once, and where each result goes.

    Args: path: which of our paths (a key of PATHS).
    Returns: (entries, place_of): entries, a list of (name, "ours" or "package", fn), each function once;
    place_of, {(name, which): the (name, which) of the entry it is measured under}, for every place of the
    table.
    """
    entries, place_of, seen = [], {}, {}
    for name, ours, package in methods(path):
        for which, fn in (("ours", ours), ("package", package)):
            if fn is None:
                continue
            if fn not in seen:
                seen[fn] = (name, which)
                entries.append((name, which, fn))
            place_of[(name, which)] = seen[fn]
    return entries, place_of


def median_times(timers, rounds, label):
    """Each timer's median over rounds. Each round runs every timer once, in an order shuffled per round, so
    that what one leaves behind (caches, allocator state) does not always fall on the same next one, and a
    machine whose speed drifts slows all of them alike. One untimed call of each warms up first.

    Args: timers: {key: function of no arguments that returns the seconds of one timed call}; rounds: timed
    rounds; label: what the progress lines on stderr name.
    Returns: {key: median seconds}.
    """
    for timer in timers.values():
        timer()
    times = {key: [] for key in timers}
    order = random.Random(0)
    for round_index in range(rounds):
        for key in order.sample(list(timers), len(timers)):
            times[key].append(timers[key]())
        print(f"  {label}: round {round_index + 1}/{rounds}", file=sys.stderr, flush=True)
    return {key: statistics.median(values) for key, values in times.items()}


def time_shape(shape, rounds, device, path, dtype=torch.float32, clock=time.perf_counter):
    """Median forward+backward milliseconds per method (median_times), and our max abs difference to the
    package.

    Args: shape: (batch * heads, queries, keys); rounds: timed rounds; device: a torch.device; path: which of
    our paths (a key of PATHS); dtype: the scores' (shape_inputs); clock: a value of CLOCKS.
    Returns: (medians, differences): {(name, "ours" or "package"): median milliseconds}, and {name: max abs
    difference of our output to the package's}.
    """
    scores, alpha_logits, upstream = shape_inputs(shape, device, dtype)
    entries, place_of = method_entries(path)
    timers = {
        (name, which): functools.partial(time_once, fn, scores, alpha_logits, upstream, device, clock)
        for name, which, fn in entries
    }
    times = median_times(timers, rounds, shape)
    medians = {place: times[key] * 1e3 for place, key in place_of.items()}
    with torch.no_grad():
        differences = {}
        for name, ours, package in methods(path):
            if package is not None:
                difference = ours(scores, alpha_logits).float() - package(scores, alpha_logits).float()
                differences[name] = difference.abs().max().item()
    return medians, differences


def memory_shape(shape, device, release_free_memory, path, dtype=torch.float32):
    """Peak memory of one forward+backward per method.

    Args: shape: (batch * heads, queries, keys); device: a torch.device; release_free_memory: on the CPU, the
    function cpu_memory_setup returns; path: which of our paths (a key of PATHS); dtype: the scores'
    (shape_inputs).
    Returns: {(name, "ours" or "package"): peak MiB}.
    """
    scores, alpha_logits, upstream = shape_inputs(shape, device, dtype)
    entries, place_of = method_entries(path)
    measured = {}
    for name, which, fn in entries:
        forward_backward(fn, scores, alpha_logits, upstream)  # allocator warm-up
        measured[(name, which)] = peak_memory(fn, scores, alpha_logits, upstream, device, release_free_memory) / 2**20
    return {place: measured[key] for place, key in place_of.items()}


def machine_description(device):
    """The machine, for the results: describe()'s, with the entmax package's version where it is installed.

    Args: device: the torch.device measured.
    """
    text = describe(device)
    if entmax_package is not None:
        text += f", entmax {getattr(entmax_package, '__version__', '?')}"
    return text


def results_rows(results):
    """The results, one row per shape and normalizer, the ratios beside them: what the table shows and --json
    writes.

    Args: results: {shape: (medians, memory, differences)}, as time_shape and memory_shape return them.
    Returns: A list of dicts (None where a figure was not measured), torch.softmax's first for each shape.
    """
    rows = []
    for shape, (medians, memory, differences) in results.items():
        softmax_ms = medians[("torch.softmax", "ours")]
        for name, _, _package in methods():
            ours_ms, package_ms = medians[(name, "ours")], medians.get((name, "package"))
            rows.append(
                {
                    "shape": list(shape),
                    "normalizer": name,
                    "ours_ms": ours_ms,
                    "package_ms": package_ms,
                    "ours_over_package": ours_ms / package_ms if package_ms is not None else None,
                    "ours_over_softmax": ours_ms / softmax_ms,
                    "ours_mib": memory.get((name, "ours")),
                    "package_mib": memory.get((name, "package")),
                    "softmax_mib": memory.get(("torch.softmax", "ours")),
                    "max_abs_diff": differences.get(name),
                }
            )
    return rows


# The table's columns: (title, key of results_rows, format); memory columns only when measured.
COLUMNS = [
    ("ours ms", "ours_ms", ".1f"),
    ("package ms", "package_ms", ".1f"),
    ("ours/package", "ours_over_package", ".2f"),
    ("ours/softmax", "ours_over_softmax", ".2f"),
]
MEMORY_COLUMNS = [
    ("ours MiB", "ours_mib", ".0f"),
    ("package MiB", "package_mib", ".0f"),
    ("softmax MiB", "softmax_mib", ".0f"),
]


def format_table(rows, measure_memory):
    """The results table.

    Args: rows: results_rows's; measure_memory: whether to show the memory columns.
    Returns: A Markdown table ("-" where a figure was not measured).
    """
    columns = COLUMNS + (MEMORY_COLUMNS if measure_memory else []) + [("max abs diff", "max_abs_diff", ".1e")]
    lines = ["| shape (b*h, q, k) | normalizer | " + " | ".join(title for title, _, _ in columns) + " |"]
    lines.append("|" + "---|" * (len(columns) + 2))
    for row in rows:
        cells = ["-" if row[key] is None else format(row[key], spec) for _, key, spec in columns]
        lines.append(f"| {'x'.join(map(str, row['shape']))} | {row['normalizer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_parser():
    """The benchmark's command line (see the top), an argparse.ArgumentParser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--shapes", nargs="*", default=None, help="e.g. 32x512x512 (default: all four)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory columns")
    parser.add_argument("--ours-only", action="store_true", help="skip the entmax package's columns")
    parser.add_argument(
        "--path",
        choices=list(PATHS),
        default="early-exit",
        help="which of our paths to measure (default: early-exit, the CPU's default)",
    )
    parser.add_argument(
        "--dtype",
        choices=list(DTYPES),
        default="float32",
        help="the scores' precision (default float32; alpha stays float32)",
    )
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall time (default) or the process's CPU time, steadier on a shared machine at --threads 1",
    )
    parser.add_argument("--json", default=None, help="also write the results to this file (JSON)")
    return parser


def main():
    """The benchmark's command line (see the top); prints the results table."""
    parser = build_parser()
    args = parser.parse_args()
    if args.ours_only:
        global entmax_package
        entmax_package = None
    dtype = DTYPES[args.dtype]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available to torch")
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes] if args.shapes else SHAPES
    for shape in shapes:
        if len(shape) != 3 or shape[0] % HEADS:
            parser.error(f"shape {shape}: give batch*heads x queries x keys with batch*heads a multiple of {HEADS}")
    if entmax_package is None and not args.ours_only:
        print("note: the entmax package is not installed; package columns are empty", file=sys.stderr)
    if args.clock == "cpu" and device.type != "cpu":
        parser.error("--clock cpu measures the CPU: use it with --device cpu")
    clock = CLOCKS[args.clock]
    timings = {shape: time_shape(shape, args.rounds, device, args.path, dtype, clock) for shape in shapes}
    # Memory is measured after every timing: on CPU it changes how the C allocator serves
    # large blocks for the rest of the process (cpu_memory_setup), which would slow the
    # timing of whatever allocates large temporaries.
    memory = {}
    if not args.no_memory:
        release_free_memory = cpu_memory_setup() if device.type == "cpu" else None
        memory = {shape: memory_shape(shape, device, release_free_memory, args.path, dtype) for shape in shapes}
    results = {
        shape: (medians, memory.get(shape, {}), differences) for shape, (medians, differences) in timings.items()
    }
    # Off the CPU the normalizers take the sync-free path whatever --path says, unless compiled.
    path = args.path if device.type == "cpu" or args.path == "compiled" else "sync-free"
    about = (
        f"forward+backward, {args.dtype}, {args.clock} time, median of {args.rounds} rounds, ours on the {path} path; "
        "ratios < 1 mean ours is faster"
    )
    record = run_record(device, machine_description(device))
    print(about)
    rows = results_rows(results)
    print(format_table(rows, not args.no_memory))
    if args.json:
        report = {
            **record,
            "about": about,
            "dtype": args.dtype,
            "clock": args.clock,
            "path": path,
            "rows": rows,
        }
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
