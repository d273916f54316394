"""Translation speed of trained models side by side: fairseq-generate's sentences/s on real
data, with the command the evaluation runs (fairseq_entmax/pipeline/evaluation.py: beam 5, batches
of at most 8000 tokens, BPE removed).

Zhao et al. (2019) report top-k attention translating twice as fast as sparsemax. This
measures it on checkpoints trained on the same data, each translating the same test set with
its own output lengths, as a user would run them; sentences/s therefore depends on how long a
model's translations are as well as on its attention, so output tokens/s and the mean output
length are reported beside it. The runs are interleaved over rounds (A, B, C, D, A, B, ...)
and the median is kept, which makes the ratios robust to a machine whose speed drifts. The
time is fairseq's own "Translated N sentences ... in Xs", which leaves out loading the model.

    # the reduced-scale reproduction's seed-1 models (docs/reproduction.md)
    W=../runs/reproduction-converged
    python -m benchmarks.translation generation --data-bin $W/data-bin --lenpen 0 \\
        softmax=$W/models/softmax-seed1/checkpoint_best.pt \\
        sparsemax=$W/models/sparsemax-seed1/checkpoint_best.pt \\
        entmax15=$W/models/entmax15-seed1/checkpoint_best.pt \\
        topk=$W/models/topk-seed1/checkpoint_best.pt
"""

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks.commands import BIN
from benchmarks.commands import run as run_command
from benchmarks.machine import run_record
from fairseq_entmax import USER_DIR

# fairseq prints the time to 0.1 s, a small run's as 0.0 s, and the rate from the exact time.
TRANSLATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in [\d.]+s \(([\d.]+) sentences/s")


def model_spec(text):
    """NAME=CHECKPOINT from the command line, as (name, Path); argparse's type."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a model as NAME=CHECKPOINT, e.g. topk=models/topk/checkpoint_best.pt"
        )
    if not Path(path).is_file():
        raise argparse.ArgumentTypeError(f"{name}: no checkpoint at {path}")
    return name, Path(path)


def translate(data_bin, checkpoint, subset, out_dir, beam, lenpen, device, fp16):
    """One fairseq-generate run.

    Args: data_bin: the data-bin; checkpoint: the model's checkpoint; subset: the subset to translate;
    out_dir: fairseq's --results-path; beam: the beam size; lenpen: the length penalty; device: "cpu" or
    "cuda"; fp16: half precision.
    Returns: (sentences, output tokens, seconds), the seconds from the rate fairseq reports.
    """
    # The evaluation's settings (fairseq_entmax.pipeline.evaluation): every sentence, batches of 8000 tokens.
    command = [BIN / "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--task", "translation", "--path"]
    command += [checkpoint, "--gen-subset", subset, "--beam", beam, "--lenpen", lenpen, "--max-tokens", 8000]
    command += ["--remove-bpe", "--results-path", out_dir] + (["--cpu"] if device == "cpu" else [])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    log = Path(out_dir) / "generate.log"
    # fairseq logs the line to its results file or, where logging was set up first, to stderr.
    text = run_command(command + (["--fp16"] if fp16 else []), log).output
    match = TRANSLATED.search(text + (Path(out_dir) / f"generate-{subset}.txt").read_text(encoding="utf-8"))
    if match is None:
        sys.exit(f"no 'Translated N sentences' line in fairseq-generate's output ({log})")
    sentences, tokens = (int(g.replace(",", "")) for g in match.group(1, 2))
    return sentences, tokens, sentences / float(match.group(3))


def speed_table(results, baseline):
    """The Markdown table of the medians.

    Args: results: name -> list of (sentences, tokens, seconds), one per round; baseline: the name every ratio
    divides by.
    Returns: The table, a str.
    """
    medians = {}
    for name, runs in results.items():
        medians[name] = {
            "sentences_per_s": statistics.median(s / t for s, _, t in runs),
            "tokens_per_s": statistics.median(k / t for _, k, t in runs),
            "tokens_per_sentence": statistics.median(k / s for s, k, _ in runs),
        }
    base = medians[baseline]
    lines = [
        f"| model | sentences/s | x {baseline} | output tokens/s | x {baseline} | output tokens per sentence |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in medians.items():
        lines.append(
            f"| {name} | {m['sentences_per_s']:.2f} | {m['sentences_per_s'] / base['sentences_per_s']:.2f} "
            f"| {m['tokens_per_s']:.1f} | {m['tokens_per_s'] / base['tokens_per_s']:.2f} "
            f"| {m['tokens_per_sentence']:.1f} |"
        )
    return "\n".join(lines), medians


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", type=model_spec, metavar="NAME=CHECKPOINT", help="the models, in order")
    parser.add_argument("--data-bin", type=Path, required=True, help="the binarized data the models were trained on")
    parser.add_argument("--subset", default="test", help="the subset translated (default: test)")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--lenpen", type=float, default=1.0, help="length penalty (the reduced-scale evaluation: 0)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved repetitions; the median is kept")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--fp16", action="store_true", help="half precision (on a GPU)")
    parser.add_argument("--threads", type=int, help="OMP threads of each fairseq-generate (default: torch's choice)")
    parser.add_argument("--baseline", help="the model every ratio divides by (default: the first)")
    parser.add_argument("--json", type=Path, help="also write the results to this file (JSON)")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.models]
    if len(set(names)) != len(names):
        parser.error(f"model names must differ: {', '.join(names)}")
    baseline = args.baseline or names[0]
    if baseline not in names:
        parser.error(f"--baseline {baseline!r} is not among the models ({', '.join(names)})")
    if not list(args.data_bin.glob("dict.*.txt")):
        parser.error(f"{args.data_bin} holds no fairseq dictionary: give the data-bin the models were trained on")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is visible")
    if args.threads:
        os.environ.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))

    results = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as tmp:
        for round_number in range(1, args.rounds + 1):
            for name, checkpoint in args.models:
                out = Path(tmp) / name
                sentences, tokens, seconds = translate(
                    args.data_bin, checkpoint, args.subset, out, args.beam, args.lenpen, args.device, args.fp16
                )
                results[name].append((sentences, tokens, seconds))
                print(
                    f"round {round_number}/{args.rounds}  {name}: {sentences} sentences, {tokens} tokens "
                    f"in {seconds:.2f} s ({sentences / seconds:.2f} sentences/s)",
                    flush=True,
                )
    counts = {runs[0][0] for runs in results.values()}
    if len(counts) != 1:
        sys.exit(f"the models translated different numbers of sentences ({sorted(counts)}): not the same test set")
    table, medians = speed_table(results, baseline)
    record = run_record(args.device)
    about = (
        f"{args.device}{' fp16' if args.fp16 else ''}, {args.threads or 'default'} threads; {counts.pop()} "
        f"{args.subset} sentences of {args.data_bin}, beam {args.beam}, lenpen {args.lenpen}; median of "
        f"{args.rounds} interleaved rounds"
    )
    print(f"\n{about}\n\n{table}")
    if args.json:
        record |= {"about": about, "rounds": results, "median": medians}
        args.json.write_text(json.dumps(record, indent=2) + "\n")
