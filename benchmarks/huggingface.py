"""Sparse attention in transformers models against transformers' own attention, side by side.

Marian (encoder-decoder) and Llama (decoder-only) at Transformer-base width (d_model 512, 8
heads, FFN 2048, 6 layers per stack), random weights built from configs, batches of sentences
of 32-128 tokens (lengths drawn uniformly, padded). For each family every attention
implementation gets the same weights and the same batch: transformers' `eager` and `sdpa`, and
this project's `sparsemax`, `entmax15`, `topk` (k = 8) and learned `alpha_entmax` (sparsify,
alpha_init 1.5, so its alphas get gradients).

Measured per family and implementation:
- a training step: forward and backward of the loss (dropout off), seconds;
- greedy generation of a fixed number of new tokens (min_new_tokens = max_new_tokens, KV
  cache), seconds;
- the peak memory of the training step: on the CPU, the peak of the bytes held by tensors
  allocated during the step (the torch profiler's memory events, summed in time order at the
  granularity of top-level operators, so a temporary freed inside one operator is not seen);
  on a GPU, torch.cuda.max_memory_allocated above what was allocated before the step.
Timed runs are interleaved over rounds (eager, sdpa, sparsemax, ..., eager, sdpa, ...) after one
warm-up run each, and the median is kept; ratios are against `eager`.

    python -m benchmarks.huggingface                    # CPU, Transformer-base width
    python -m benchmarks.huggingface --device cuda         # on a GPU
    python -m benchmarks.huggingface --size tiny --rounds 1 --json out.json   # a quick look

From another script (e.g. a GPU check): `measure(size="base", device="cuda", rounds=3)` returns
the report that --json writes.
"""

import argparse
import functools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM, MarianConfig, MarianMTModel
from transformers.utils import logging as transformers_logging

import fairseq_entmax.huggingface as sparse_hf
from benchmarks.machine import describe, run_record

# name -> sparsify options (None: the registered name alone); the first is every ratio's baseline.
IMPLEMENTATIONS = {
    "eager": None,
    "sdpa": None,
    "sparsemax": None,
    "entmax15": None,
    "topk": None,
    "alpha_entmax": {"alpha_init": 1.5},
}
BASELINE = "eager"

SIZES = {
    "base": {
        "dim": 512,
        "heads": 8,
        "ffn": 2048,
        "layers": 6,
        "vocab": 8000,
        "lengths": (32, 128),
        "batch": 8,
        "new_tokens": 32,
    },
    "tiny": {
        "dim": 32,
        "heads": 4,
        "ffn": 64,
        "layers": 1,
        "vocab": 100,
        "lengths": (6, 12),
        "batch": 2,
        "new_tokens": 4,
    },
}
FAMILIES = ("marian", "llama")
PAD, EOS, BOS = 0, 1, 2


def build_model(family, size, implementation):
    """A model of `family` with the seed's random weights and `implementation`'s attention.

    Args: family: "marian" or "llama"; size: a value of SIZES; implementation: a key of IMPLEMENTATIONS.
    Returns: The model, dropout off.
    """
    if family == "marian":
        model_class = MarianMTModel
        config = MarianConfig(
            vocab_size=size["vocab"],
            d_model=size["dim"],
            encoder_layers=size["layers"],
            decoder_layers=size["layers"],
            encoder_attention_heads=size["heads"],
            decoder_attention_heads=size["heads"],
            encoder_ffn_dim=size["ffn"],
            decoder_ffn_dim=size["ffn"],
            max_position_embeddings=2 * size["lengths"][1] + size["new_tokens"],
            pad_token_id=PAD,
            eos_token_id=EOS,
            decoder_start_token_id=PAD,
            dropout=0.0,
            attention_dropout=0.0,
        )
    else:
        model_class = LlamaForCausalLM
        config = LlamaConfig(
            vocab_size=size["vocab"],
            hidden_size=size["dim"],
            num_hidden_layers=size["layers"],
            num_attention_heads=size["heads"],
            num_key_value_heads=size["heads"],
            intermediate_size=size["ffn"],
            max_position_embeddings=2 * size["lengths"][1] + size["new_tokens"],
            pad_token_id=PAD,
            bos_token_id=BOS,
            eos_token_id=EOS,
        )
    options = IMPLEMENTATIONS[implementation]
    torch.manual_seed(0)
    if options is None:
        return model_class._from_config(config, attn_implementation=implementation)
    return sparse_hf.sparsify(model_class._from_config(config, attn_implementation="eager"), implementation, **options)


def _padded(lengths, padding_side, vocab, generator):
    total = max(lengths)
    ids = torch.randint(BOS + 1, vocab, (len(lengths), total), generator=generator)
    mask = torch.zeros(len(lengths), total, dtype=torch.long)
    for row, length in enumerate(lengths):
        if padding_side == "right":
            mask[row, :length] = 1
        else:
            mask[row, total - length :] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def batches(family, size, device):
    """The training batch and the generation inputs of a family (the same for every implementation).

    Returns: (training inputs with labels, generation inputs): Marian's sources and targets right-padded;
    Llama's sequences right-padded for training and its prompts left-padded for generation.
    """
    generator = torch.Generator().manual_seed(1)
    rng = random.Random(1)
    low, high = size["lengths"]
    lengths = [rng.randint(low, high) for _ in range(size["batch"])]
    if family == "marian":
        source, source_mask = _padded(lengths, "right", size["vocab"], generator)
        target, target_mask = _padded([rng.randint(low, high) for _ in lengths], "right", size["vocab"], generator)
        train = {
            "input_ids": source,
            "attention_mask": source_mask,
            "labels": target.masked_fill(target_mask == 0, -100),
        }
        generate = {"input_ids": source, "attention_mask": source_mask}
    else:
        ids, mask = _padded(lengths, "right", size["vocab"], generator)
        train = {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        prompts, prompt_mask = _padded(lengths, "left", size["vocab"], generator)
        generate = {"input_ids": prompts, "attention_mask": prompt_mask}
    move = lambda inputs: {name: value.to(device) for name, value in inputs.items()}  # noqa: E731
    return move(train), move(generate)


def _synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def training_step(model, inputs):
    """Forward and backward of the loss (in training mode); the gradients are dropped."""
    model.train()
    model.zero_grad(set_to_none=True)
    model(**inputs).loss.backward()


@torch.no_grad()
def greedy_generation(model, inputs, new_tokens):
    """Greedy generation (in eval mode) of exactly `new_tokens` tokens with the KV cache."""
    model.eval()
    return model.generate(
        **inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1, use_cache=True
    )


def timed(call, device):
    """Seconds that call() takes."""
    _synchronize(device)
    start = time.perf_counter()
    call()
    _synchronize(device)
    return time.perf_counter() - start


def peak_memory(call, device):
    """Peak bytes of the tensors call() allocates (see the module's docstring for how).

    Args: call: the step; device: the torch.device it runs on.
    Returns: Bytes, an int.
    """
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        call()
    events = sorted(
        (event for event in profiler.events() if event.cpu_parent is None), key=lambda e: e.time_range.start
    )
    live = peak = 0
    for event in events:
        live += event.cpu_memory_usage
        peak = max(peak, live)
    return peak


def measure(size="base", device="cpu", rounds=5, batch=None, progress=print):
    """Run the benchmark.

    Args: size: a key of SIZES; device: "cpu" or "cuda"; rounds: timed rounds after the warm-up round; batch:
    sentences per batch (None: the size's); progress: called with a line of progress (print by default; None
    for silence).
    Returns: {"machine", "size", "device", "rounds", "results": {family: {implementation: {"train_s",
    "generate_s" (medians), "peak_bytes", "train_ratio", "generate_ratio", "memory_ratio" (against eager),
    "train_rounds", "generate_rounds" (every round's seconds)}}}}.
    """
    progress = progress or (lambda line: None)
    device = torch.device(device)
    settings = dict(SIZES[size], **({} if batch is None else {"batch": batch}))
    results = {}
    for family in FAMILIES:
        train_inputs, generate_inputs = batches(family, settings, device)
        models = {name: build_model(family, settings, name).to(device) for name in IMPLEMENTATIONS}
        steps = {
            name: (
                functools.partial(training_step, model, train_inputs),
                functools.partial(greedy_generation, model, generate_inputs, settings["new_tokens"]),
            )
            for name, model in models.items()
        }
        rows = {name: {"train_rounds": [], "generate_rounds": []} for name in IMPLEMENTATIONS}
        for name, (train, generate) in steps.items():
            train(), generate()  # warm-up
            rows[name]["peak_bytes"] = peak_memory(train, device)
            progress(f"{family}: {name} warmed up, peak {rows[name]['peak_bytes'] / 2**20:.1f} MB")
        for round_index in range(rounds):
            for name, (train, _) in steps.items():
                rows[name]["train_rounds"].append(timed(train, device))
            for name, (_, generate) in steps.items():
                rows[name]["generate_rounds"].append(timed(generate, device))
            progress(
                f"{family}: round {round_index + 1}/{rounds}: "
                + ", ".join(
                    f"{name} {row['train_rounds'][-1]:.3f}/{row['generate_rounds'][-1]:.3f} s"
                    for name, row in rows.items()
                )
            )
        for row in rows.values():
            row["train_s"] = statistics.median(row["train_rounds"])
            row["generate_s"] = statistics.median(row["generate_rounds"])
        base = rows[BASELINE]
        for row in rows.values():
            row["train_ratio"] = row["train_s"] / base["train_s"]
            row["generate_ratio"] = row["generate_s"] / base["generate_s"]
            row["memory_ratio"] = row["peak_bytes"] / base["peak_bytes"]
        results[family] = rows
        del models, steps
    return {
        "machine": f"{describe(device)}, transformers {transformers.__version__}",
        "size": size,
        "batch": settings["batch"],
        "device": device.type,
        "rounds": rounds,
        "results": results,
    }


def format_report(report):
    """The report as a markdown table, one row per family and implementation."""
    lines = [
        f"{report['machine']}; size {report['size']}, batches of {report['batch']}, {report['rounds']} rounds, "
        "ratios against eager",
        "",
        "| model | attention | train step s | x eager | generate s | x eager | peak MB | x eager |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for family, rows in report["results"].items():
        for name, row in rows.items():
            lines.append(
                f"| {family} | {name} | {row['train_s']:.3f} | {row['train_ratio']:.2f} | {row['generate_s']:.3f} | "
                f"{row['generate_ratio']:.2f} | {row['peak_bytes'] / 2**20:.1f} | {row['memory_ratio']:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--size", choices=sorted(SIZES), default="base", help="base: Transformer-base width; tiny: a test"
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds after a warm-up (default 5)")
    parser.add_argument("--batch", type=int, help="sentences per batch (default: 8 at base size, 2 at tiny)")
    parser.add_argument("--json", type=Path, help="also write the report, with every round, to this file")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch must be at least 1, got {args.batch}")
    if args.device not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no GPU here; run on the CPU (--device cpu)")
    transformers_logging.set_verbosity_error()
    report = measure(
        args.size, args.device, args.rounds, progress=lambda line: print(line, file=sys.stderr, flush=True)
    )
    report |= run_record(args.device, machine=report["machine"])
    print(format_report(report))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
