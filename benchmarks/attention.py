"""Long inputs through fairseq_entmax.attention.scaled_dot_product_attention, side by side in one
run with torch's fused attention and the materialized path: peak memory and time of one forward
and backward.

Settings:
  raw    the attention alone: batch 1, 8 heads, head dim 64, float32, random N(0, 1) query, key
         and value, causal or not, the summed output's backward.
  short  training at translation lengths: raw attention with batch SHORT_BATCH_TOKENS / tokens,
         the mean of SHORT_PASSES forward and backward passes; besides the function's own
         choice ("blocked", which computes such small calls whole) its blocks are forced
         ("blocks", block_queries given): what recomputing the probabilities costs there;
  clustered  raw attention, causal, on the pattern trained sparse heads show (clustered_inputs):
         scores that fall with the distance between query and key, each head at its own
         offset, plus 4 keys every query attends to; each table gives each normalizer's
         fraction of zero key blocks (block_sparsity), of all heads and of each head (which a
         block of one head, as at long context, skips);
  captured  raw attention, causal, on the queries, keys and values of a small byte-level language
         model with learned alpha-entmax, trained here on --text (benchmarks/captured_attention.py;
         minutes, once, then read from --capture-dir): its 2 layers' 4 heads side by side, each
         head of alpha_entmax at its learned alpha; the fraction of zero key blocks is given per
         head too. Not in the default --settings.
  step   a generation step: one query against keys (batch 4, 8 heads, head dim 64), forward only,
         the mean over STEP_CALLS calls (its peak memory is that of one call);
  llama  a Hugging Face Llama (hidden 256, 8 heads, 2 layers, intermediate 512, vocabulary 1,000),
         random tokens, its language-model loss's backward.
Rows: torch's scaled_dot_product_attention (sdpa), then each normalizer through the blocked
function ("blocked") and through the materialized path ("materialized": the scores, the
normalizer module, times the values; transformers' eager attention with the function's
normalizer, for llama), alpha_entmax with a learned alpha per head (random init; clustered: 1.5;
captured: the model's),
topk with k = 8.

Each measurement is a fresh process (benchmarks/fresh_process.py) that runs the pass once; with
--rounds N every row is measured N times, the rows in turn, and the medians are kept:
  seconds   the wall time of the forward and backward (short and step: per pass, per call);
  peak MiB  the peak resident set size (getrusage) minus the resident size just before the pass.
A process whose pass needs more than --memory-limit GiB of address space is stopped by that
limit (RLIMIT_AS) and its row says so: the materialized path at 16,384 tokens.

    python -m benchmarks.attention                                  # every setting but captured
    python -m benchmarks.attention --settings raw --tokens 1024 4096 --json out.json
    python -m benchmarks.attention --settings short --causal full
    python -m benchmarks.attention --settings captured --text train.en      # a model trained on it
    python -m benchmarks.attention --device cuda                    # on a GPU (memory: CUDA's peak)
    python -m benchmarks.attention --settings raw --dry-run         # its tables and rows, nothing measured
"""

import argparse
import functools
import json
import resource
import statistics
import sys
import time
from pathlib import Path

from benchmarks import captured_attention
from benchmarks.fresh_process import call_in_fresh_process
from fairseq_entmax.names import NORMALIZER_NAMES

SETTINGS = ("raw", "clustered", "captured", "short", "step", "llama")
# captured trains a model first (minutes) and needs --text: asked for by name only.
DEFAULT_SETTINGS = tuple(setting for setting in SETTINGS if setting != "captured")
DEFAULT_TOKENS = {
    "raw": (1024, 4096, 16384),
    "clustered": (4096, 16384),
    "captured": (4096,),
    "short": (32, 128, 512),
    "step": (64, 256, 1024),
    "llama": (2048, 8192),
}
# block_sparsity's blocks: 64 queries (MIN_BLOCK_QUERIES of fairseq_entmax.attention) by its
# SUPPORT_KEYS keys.
SPARSITY_QUERIES = 64
STEP_CALLS = 200
SHORT_BATCH_TOKENS, SHORT_PASSES = 4096, 10
HEADS, HEAD_DIM = 8, 64
REPO = Path(__file__).resolve().parents[1]
DEFAULT_TEXT = REPO.parent / "shared/data/iwslt16_de_en_sample/train.en"


def _rss_mib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def clustered_inputs(tokens, device="cpu"):
    """(query, key, value) of batch 1, HEADS heads, head dim 64, whose causal scores follow what trained sparse
    heads attend to. 60 dims encode positions with 30 frequencies from pi to pi / tokens (as rotary embeddings
    do), so that head h's query i scores key j by the sum of cos(frequency * (i - h % 4 - j)): highest at h %
    4 tokens back, falling with the distance; one dim gives keys 0-3 a score 0.5 below that peak, seen from
    every query; 3 dims of small noise. Values are N(0, 1).
    """
    import math

    import torch

    generator = torch.Generator().manual_seed(0)
    frequencies = math.pi * torch.logspace(0, -math.log10(tokens), 30)
    position = torch.arange(tokens, dtype=torch.float32)
    peak = 2.0  # the scaled score at the peak, against about 0 far away
    amplitude = math.sqrt(HEAD_DIM**0.5 * peak / len(frequencies))
    query, key = torch.zeros(2, 1, HEADS, tokens, HEAD_DIM)
    for head in range(HEADS):
        for tensor, positions in ((query[0, head], position - head % 4), (key[0, head], position)):
            angles = positions[:, None] * frequencies
            tensor[:, 0:60:2], tensor[:, 1:60:2] = amplitude * angles.cos(), amplitude * angles.sin()
    query[..., 60] = 1.0
    key[..., :4, 60] = HEAD_DIM**0.5 * (peak - 0.5)
    query[..., 61:] = 0.3 * torch.randn(1, HEADS, tokens, 3, generator=generator)
    key[..., 61:] = 0.3 * torch.randn(1, HEADS, tokens, 3, generator=generator)
    value = torch.randn(1, HEADS, tokens, HEAD_DIM, generator=generator)
    return tuple(tensor.to(device).requires_grad_() for tensor in (query, key, value))


def _clustered_options(normalizer_name):
    """On clustered inputs every head of learned alpha-entmax starts at alpha 1.5: a random start puts some heads
    next to softmax, whose weights then reach every key block.
    """
    return {"alpha_init": 1.5} if normalizer_name == "alpha_entmax" else {}


def _patterned_inputs(normalizer_name, tokens, device, capture=None):
    """The clustered setting's query, key and value (capture None) or those of a capture file
    (captured_attention.capture), with the normalizer module built for them.
    """
    import torch

    from fairseq_entmax.normalizers import build_normalizer

    if capture is None:
        query, key, value = clustered_inputs(tokens, device)
        return query, key, value, build_normalizer(normalizer_name, HEADS, **_clustered_options(normalizer_name))
    saved = torch.load(capture, weights_only=True)
    query, key, value = (saved[name].to(device).requires_grad_() for name in ("query", "key", "value"))
    normalizer = build_normalizer(normalizer_name, HEADS)
    if normalizer.learns_alpha:
        with torch.no_grad():
            normalizer.alpha_logit.copy_(saved["alpha_logit"])
    return query, key, value, normalizer


def block_sparsity(normalizer_name, tokens, device="cpu", capture=None):
    """The fraction of the causally visible (SPARSITY_QUERIES queries, SUPPORT_KEYS keys) blocks of the clustered
    inputs (or of a capture file's) in which the normalizer gives 0 weight.

    Returns: (the fraction where every head's weights are 0, which a block of every head skips; the fraction
    of each head, a list: what a block of one head skips, as at long context).
    """
    import torch

    from fairseq_entmax.attention.blocked import SUPPORT_KEYS

    torch.manual_seed(0)
    query, key, _, normalizer = _patterned_inputs(normalizer_name, tokens, device, capture)
    normalizer.to(device)
    zero_heads, zero, visible = torch.zeros(HEADS), 0, 0
    with torch.no_grad():
        for q0 in range(0, tokens, SPARSITY_QUERIES):
            q1 = min(tokens, q0 + SPARSITY_QUERIES)
            scores = torch.matmul(query[:, :, q0:q1], key[:, :, :q1].transpose(-1, -2)) * HEAD_DIM**-0.5
            future = torch.arange(q1, device=device) > torch.arange(q0, q1, device=device)[:, None]
            weights = normalizer(scores.masked_fill(future, float("-inf")).view(HEADS, q1 - q0, q1))
            blocks = -(-q1 // SUPPORT_KEYS)
            seen = torch.nn.functional.pad((weights != 0).any(dim=1), (0, blocks * SUPPORT_KEYS - q1))
            seen = seen.view(HEADS, blocks, SUPPORT_KEYS).any(dim=2).cpu()
            zero_heads += (~seen).sum(dim=1)
            zero += int((~seen.any(dim=0)).sum())
            visible += blocks
    return zero / visible, (zero_heads / visible).tolist()


def _raw_pass(path, normalizer_name, tokens, causal, device, batch=1, passes=1, clustered=False, capture=None):
    import torch

    from fairseq_entmax.attention import scaled_dot_product_attention
    from fairseq_entmax.normalizers import build_normalizer

    torch.manual_seed(0)
    if clustered or capture:
        query, key, value, normalizer = _patterned_inputs(normalizer_name, tokens, device, capture)
    else:
        query, key, value = (
            torch.randn(batch, HEADS, tokens, HEAD_DIM, device=device, requires_grad=True) for _ in range(3)
        )
        normalizer = build_normalizer(normalizer_name, HEADS)
    normalizer = None if path == "sdpa" else normalizer.to(device)

    def materialized():
        scores = torch.matmul(query, key.transpose(-1, -2)) * HEAD_DIM**-0.5
        if causal:
            future = torch.ones(tokens, tokens, dtype=torch.bool, device=device).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        weights = normalizer(scores.view(batch * HEADS, tokens, tokens)).view_as(scores)
        return torch.matmul(weights, value)

    def run():
        for _ in range(passes):
            if path == "sdpa":
                output = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=causal)
            elif path in ("blocked", "blocks"):
                output = scaled_dot_product_attention(
                    query,
                    key,
                    value,
                    is_causal=causal,
                    normalizer=normalizer,
                    block_queries=tokens if path == "blocks" else None,
                )
            else:
                output = materialized()
            output.sum().backward()

    return run


def _clustered_pass(path, normalizer_name, tokens, causal, device):
    return _raw_pass(path, normalizer_name, tokens, causal, device, clustered=True)


def _captured_pass(path, normalizer_name, tokens, causal, device, capture):
    return _raw_pass(path, normalizer_name, tokens, causal, device, capture=capture)


def _short_pass(path, normalizer_name, tokens, causal, device):
    return _raw_pass(path, normalizer_name, tokens, causal, device, SHORT_BATCH_TOKENS // tokens, SHORT_PASSES)


def _step_pass(path, normalizer_name, tokens, causal, device):
    import torch

    from fairseq_entmax.attention import scaled_dot_product_attention
    from fairseq_entmax.normalizers import build_normalizer

    torch.manual_seed(0)
    query = torch.randn(4, HEADS, 1, HEAD_DIM, device=device)
    key, value = (torch.randn(4, HEADS, tokens, HEAD_DIM, device=device) for _ in range(2))
    normalizer = build_normalizer(normalizer_name, HEADS).to(device)

    def one_call():
        if path == "sdpa":
            return torch.nn.functional.scaled_dot_product_attention(query, key, value)
        if path == "blocked":
            return scaled_dot_product_attention(query, key, value, normalizer=normalizer)
        scores = torch.matmul(query, key.transpose(-1, -2)) * HEAD_DIM**-0.5
        return torch.matmul(normalizer(scores.view(4 * HEADS, 1, tokens)).view_as(scores), value)

    def run():
        with torch.no_grad():
            for _ in range(STEP_CALLS):
                one_call()

    return run


def _llama_pass(path, normalizer_name, tokens, causal, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import fairseq_entmax.huggingface as sparse_hf

    config = LlamaConfig(
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        max_position_embeddings=tokens,
    )
    torch.manual_seed(0)
    implementation = "sdpa" if path == "sdpa" else "eager"
    model = LlamaForCausalLM._from_config(config, attn_implementation=implementation).to(device).train()
    if path != "sdpa":
        model = sparse_hf.sparsify(model, normalizer_name, alpha_init="random")
    tokens_in = torch.randint(0, 1000, (1, tokens), device=device)

    def run():
        # output_attentions makes the functions take their materialized path.
        output = model(input_ids=tokens_in, labels=tokens_in, output_attentions=path == "materialized")
        output.loss.backward()

    return run


def measure(setting, path, normalizer_name, tokens, causal, device, threads, memory_limit_gib, capture=None):
    """One pass in this (fresh) process (capture: the captured setting's file).

    Returns: {"seconds": float, "peak_mib": float} or {"refused": message} where the memory limit stopped it.
    """
    import torch

    torch.set_num_threads(threads)
    if device == "cpu" and memory_limit_gib:
        # Within a limit the process already has (prlimit), which it may not raise.
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        limit = (
            int(memory_limit_gib * 2**30)
            if hard == resource.RLIM_INFINITY
            else min(hard, int(memory_limit_gib * 2**30))
        )
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    build = {
        "raw": _raw_pass,
        "clustered": _clustered_pass,
        "captured": functools.partial(_captured_pass, capture=capture),
        "short": _short_pass,
        "step": _step_pass,
        "llama": _llama_pass,
    }[setting]
    try:
        run = build(path, normalizer_name, tokens, causal, device)
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        else:
            before = _rss_mib()
        start = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = (time.perf_counter() - start) / {"step": STEP_CALLS, "short": SHORT_PASSES}.get(setting, 1)
    except (MemoryError, RuntimeError) as error:
        if "memory" not in str(error).lower() and not isinstance(error, MemoryError):
            raise
        return {"refused": f"out of memory within {memory_limit_gib:g} GiB"}
    if device == "cuda":
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
    return {"seconds": seconds, "peak_mib": peak}


def _median_pass(passes):
    """The median seconds and peak MiB of a row's passes (each a measure result)."""
    return {key: statistics.median(result[key] for result in passes) for key in ("seconds", "peak_mib")}


def _capture(text, tokens, path):
    """Train the captured setting's model if its capture is not on file; its source and alphas."""
    saved = captured_attention.capture(text, tokens, path, log=functools.partial(print, flush=True))
    return saved["source"], saved["alpha"].tolist()


def rows(setting):
    """The (path, normalizer) rows of a setting's table, torch's sdpa first."""
    paths = ("blocked", "blocks", "materialized") if setting == "short" else ("blocked", "materialized")
    return [("sdpa", "softmax")] + [(path, name) for name in NORMALIZER_NAMES for path in paths]


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=SETTINGS, default=list(DEFAULT_SETTINGS))
    parser.add_argument(
        "--tokens", nargs="+", type=int, help="lengths (default: 1,024 4,096 16,384; llama 2,048 8,192)"
    )
    parser.add_argument(
        "--causal",
        choices=["both", "causal", "full"],
        default="both",
        help="raw and short only (llama is causal, a step sees every key)",
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=1, help="passes of each row, interleaved; the median is kept")
    parser.add_argument("--memory-limit", type=float, default=16.0, help="GiB of address space per process (CPU)")
    parser.add_argument(
        "--skip-materialized-above",
        type=int,
        default=16384,
        help="tokens above which the materialized rows are skipped",
    )
    parser.add_argument(
        "--text", type=Path, default=DEFAULT_TEXT, help="captured: the model's training text (default: %(default)s)"
    )
    parser.add_argument(
        "--capture-dir",
        type=Path,
        default=REPO / "runs" / "attention-capture",
        help="captured: where the trained model's captures are kept (default: %(default)s)",
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument(
        "--dry-run", action="store_true", help="print each table and its rows after the checks, measure nothing"
    )
    return parser


def _tables(args):
    """(setting, tokens, causal, title) of each table the command line asks for, in order."""
    for setting in args.settings:
        shapes = (
            [setting in ("llama", "clustered", "captured")]
            if setting not in ("raw", "short")
            else {"both": [True, False], "causal": [True], "full": [False]}[args.causal]
        )
        for tokens in args.tokens or DEFAULT_TOKENS[setting]:
            for causal in shapes:
                shape = "one query" if setting == "step" else "causal" if causal else "full"
                yield setting, tokens, causal, f"{setting}, {tokens:,} tokens, {shape}"


def _table_rows(args, setting, tokens):
    return [row for row in rows(setting) if row[0] != "materialized" or tokens <= args.skip_materialized_above]


def _measure_table(args, setting, tokens, causal, capture, sparsity):
    """Measures every row of one table, prints it and returns its result dicts."""
    table_results = []
    print("| path | normalizer | seconds | / sdpa | peak MiB | / sdpa |")
    print("|---|---|---|---|---|---|")
    table = _table_rows(args, setting, tokens)
    # Rounds of every row in turn (A, B, C, A, B, C, ...): a slower minute of the
    # machine slows each row alike, and the median is kept.
    measured = {row: [] for row in table}
    for _ in range(args.rounds):
        for path, name in table:
            measured[path, name].append(
                call_in_fresh_process(
                    measure,
                    setting,
                    path,
                    name,
                    tokens,
                    causal,
                    args.device,
                    args.threads,
                    args.memory_limit,
                    capture,
                )
            )
    baseline = None
    for (path, name), passes in measured.items():
        result = passes[0] if "refused" in passes[0] else _median_pass(passes)
        table_results.append(dict(setting=setting, tokens=tokens, causal=causal, path=path, normalizer=name, **result))
        if name in sparsity and path != "sdpa":
            table_results[-1]["zero_key_blocks"], table_results[-1]["zero_key_blocks_per_head"] = sparsity[name]
        if "refused" in result:
            print(f"| {path} | {name} | {result['refused']} | | | |", flush=True)
            continue
        baseline = baseline or result
        print(
            f"| {path} | {name} | {result['seconds']:.3g} | {result['seconds'] / baseline['seconds']:.2f} "
            f"| {result['peak_mib']:.0f} | {result['peak_mib'] / baseline['peak_mib']:.2f} |",
            flush=True,
        )
    return table_results


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.memory_limit <= 0:
        print("attention: --threads, --rounds and --memory-limit must be positive", file=sys.stderr)
        return 2
    if "captured" in args.settings and not args.text.is_file():
        print(f"attention: the captured setting trains on --text, and {args.text} is not a file", file=sys.stderr)
        return 2
    import torch

    from benchmarks.machine import run_record

    torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("attention: --device cuda but torch sees no CUDA device", file=sys.stderr)
        return 2
    command = f"python -m benchmarks.attention {' '.join(argv if argv is not None else sys.argv[1:])}"
    record = run_record(args.device, command=command)
    if args.dry_run:
        for setting, tokens, _, title in _tables(args):
            measured = ", ".join(f"{path} {name}" for path, name in _table_rows(args, setting, tokens))
            print(f"{title}: {args.rounds} round(s) of {measured}")
        return 0
    results = []
    for setting, tokens, causal, title in _tables(args):
        print(f"\n{title}")
        sparsity, capture = {}, None
        if setting == "captured":
            capture = args.capture_dir / f"{args.text.stem}-{tokens}.pt"
            try:
                source, alphas = call_in_fresh_process(_capture, args.text, tokens, capture)
            except ValueError as error:
                print(f"attention: {error}", file=sys.stderr)
                return 2
            print(f"captured from a byte model trained on {source}")
            print("learned alphas: " + " ".join(f"{alpha:.2f}" for alpha in alphas))
        if setting in ("clustered", "captured"):
            sparsity = {
                name: call_in_fresh_process(block_sparsity, name, tokens, args.device, capture)
                for name in NORMALIZER_NAMES
            }
            print("zero key blocks: " + ", ".join(f"{name} {value:.2f}" for name, (value, _) in sparsity.items()))
            for name, (_, heads) in sparsity.items():
                print(f"  per head, {name}: " + " ".join(f"{value:.2f}" for value in heads))
        results += _measure_table(args, setting, tokens, causal, capture, sparsity)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({**record, "results": results}, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
