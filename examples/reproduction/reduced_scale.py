"""Reduced-scale reproduction of Correia et al. (2019) on real TED data that fits a CPU.

Does sparse attention cost accuracy? Softmax, 1.5-entmax, learned alpha-entmax and top-k
(k = 8) small Transformers, trained with the same size, data and number of updates, two or
more seeds each, on the IWSLT16 de-en sample in ../shared/data (19,689 TED training pairs,
valid TED tst2013, test TED tst2014), evaluated on tst2014: tokenized BLEU, sacreBLEU, chrF,
training time, attention density and learned alphas. See docs/reproduction.md.

    .venv/bin/python examples/reproduction/iwslt_small.py                 # the full run (CPU hours)
    .venv/bin/python examples/reproduction/iwslt_small.py --budget short  # 80 min on 2 cores as two processes (docs)
    .venv/bin/python examples/reproduction/iwslt_small.py --budget tiny   # every stage in minutes

Resumable: rerun the same command after an interruption; finished models are not retrained.
"""
import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]
REPO = EXAMPLES.parent
sys.path.insert(0, str(EXAMPLES))

from entmax_recipes import pipeline  # noqa: E402
from entmax_recipes.pipeline import TrainSettings, log  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "iwslt16_de_en_sample"
SRC, TGT = "de", "en"

# One model size and budget for every variant and seed. "small": a 3+3-layer Transformer of
# width 256 (fairseq's transformer_iwslt_de_en halved in width and depth), 8000 BPE merges
# for 20k training pairs, 4096-token batches, 2000 updates (about 13 epochs), average of the
# last 5 states. Measured 2.6-2.9 s of CPU per update on one core (softmax and alpha-entmax
# alike): about 1.5 CPU-hours per model, 12 for the 8 models. "short": what fits a
# session on 2 cores: 3+3 layers of width 128, 2048-token batches (more updates for the same
# work, and a higher learning rate, suit a model this small), 1600 updates (about 5 epochs);
# measured 16.6-19.9 minutes of training per model with two runs side by side, 80 minutes for
# the 8 models. "tiny": the same stages in minutes,
# to check the script.
BUDGETS = {
    "small": {"bpe_merges": 8000, "layers": 3, "dim": 256, "ffn": 1024, "heads": 4, "max_update": 2000,
              "max_tokens": 4096, "lr": 1e-3, "warmup": 500, "dropout": 0.3, "average": 5,
              "train_lines": None, "test_lines": None, "analysis_sentences": 500, "max_len": None},
    "short": {"bpe_merges": 8000, "layers": 3, "dim": 128, "ffn": 512, "heads": 4, "max_update": 1600,
              "max_tokens": 2048, "lr": 2e-3, "warmup": 400, "dropout": 0.1, "average": 3,
              "train_lines": None, "test_lines": None, "analysis_sentences": 500, "max_len": None},
    "tiny": {"bpe_merges": 500, "layers": 1, "dim": 64, "ffn": 128, "heads": 4, "max_update": 60,
             "max_tokens": 2048, "lr": 1e-3, "warmup": 20, "dropout": 0.1, "average": 2,
             "train_lines": 2000, "test_lines": 100, "analysis_sentences": 50,
             # a barely trained model would otherwise spend fairseq's default 200 tokens on
             # every sentence
             "max_len": (1.2, 10)},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="small")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2], help="seeds per variant (default: 1 2)")
    parser.add_argument("--models", nargs="+", default=list(pipeline.VARIANTS), choices=pipeline.VARIANTS)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="the IWSLT16 de-en sample: train/valid/test.{de,en} (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="default: runs/reproduction-iwslt-<budget>")
    parser.add_argument("--max-update", type=int, help="training updates of every model (default: per budget)")
    parser.add_argument("--threads", type=int, help="CPU threads per fairseq process")
    return parser.parse_args(argv)


def main(argv=None):
    return pipeline.run_reporting_errors(run, parse_args(argv))


def _take_lines(in_path, out_path, n):
    lines = pipeline.read_lines(in_path)
    Path(out_path).write_text("\n".join(lines[:n] if n else lines) + "\n", encoding="utf-8")


def run(args):
    budget = dict(BUDGETS[args.budget])
    if args.max_update:
        budget["max_update"] = args.max_update
    work = (args.work_dir or REPO / "runs" / f"reproduction-iwslt-{args.budget}").resolve()
    started = time.time()
    files = {s: (args.data / f"{s}.{SRC}", args.data / f"{s}.{TGT}") for s in pipeline.SPLITS}
    pipeline.check_parallel_corpus(files)

    raw_dir = work / "raw"
    limits = {"train": budget["train_lines"], "valid": budget["test_lines"], "test": budget["test_lines"]}
    # A corpus prepared from other data or with other limits is refused, not reused.
    prepared_from = {"data": str(args.data.resolve()), "lines": limits}
    if not pipeline.done_with(raw_dir / "prepare.done", prepared_from, "the prepared corpus"):
        raw_dir.mkdir(parents=True, exist_ok=True)
        for split, pair in files.items():
            for lang, path in zip((SRC, TGT), pair):
                _take_lines(path, raw_dir / f"{split}.{lang}", limits[split])
        pipeline.mark_done(raw_dir / "prepare.done", settings=prepared_from)
    counts = pipeline.check_parallel_corpus({s: (raw_dir / f"{s}.{SRC}", raw_dir / f"{s}.{TGT}") for s in pipeline.SPLITS})
    log(f"IWSLT16 de-en sample ({args.budget} budget): " + ", ".join(f"{s} {n} pairs" for s, n in counts.items()))

    text_dir, data_bin = pipeline.build_dataset(raw_dir, SRC, TGT, work, budget["bpe_merges"])
    settings = TrainSettings(
        arch="adaptively_sparse_transformer", max_update=budget["max_update"], max_tokens=budget["max_tokens"],
        lr=budget["lr"], warmup_updates=budget["warmup"], dropout=budget["dropout"], topk=8,
        keep_last_epochs=budget["average"], log_interval=100,
        model_args=["--encoder-layers", budget["layers"], "--decoder-layers", budget["layers"],
                    "--encoder-embed-dim", budget["dim"], "--decoder-embed-dim", budget["dim"],
                    "--encoder-ffn-embed-dim", budget["ffn"], "--decoder-ffn-embed-dim", budget["ffn"],
                    "--encoder-attention-heads", budget["heads"], "--decoder-attention-heads", budget["heads"]],
    )
    references_tok = pipeline.read_lines(text_dir / f"test.{TGT}")
    references_raw = pipeline.read_lines(raw_dir / f"test.{TGT}")
    runs = [(variant, seed) for seed in args.seeds for variant in args.models]
    rows = []
    for i, (variant, seed) in enumerate(runs, 1):
        row = pipeline.train_and_evaluate(
            data_bin, work, variant, seed, settings, references_tok, references_raw, TGT,
            label=f"{variant} seed {seed} [{i}/{len(runs)}]", average_last=budget["average"], threads=args.threads,
            max_len=budget["max_len"])
        # The checkpoint lies in the model's save dir, beside fairseq-train's log.
        row["valid_ppl"] = last_valid_perplexity(Path(row["checkpoint"]).parent / "train.log")
        rows.append(row)

    analysis = pipeline.analyze(data_bin, {f"{r['model']}-seed{r['seed']}": r["checkpoint"] for r in rows},
                                "test", work / "analysis", work / "analysis.log",
                                num_sentences=budget["analysis_sentences"])
    for row in rows:
        row.update((analysis or {}).get(f"{row['model']}-seed{row['seed']}", {}))

    report = summarize(rows, args, counts)
    (work / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (work / "results.md").write_text(report + "\n")
    print()
    print(report)
    print(f"\nresults: {work / 'results.md'}; total time {pipeline.format_seconds(time.time() - started)}")


def last_valid_perplexity(train_log):
    """Perplexity on the validation set (TED tst2013) after the last epoch, from fairseq's log:
    a measure of accuracy that is less coarse than BLEU while BLEU is low."""
    valid_lines = [line for line in pipeline.read_lines(train_log) if "| valid on 'valid' subset |" in line]
    if not valid_lines:
        return None
    return float(re.search(r"\| ppl ([\d.]+)", valid_lines[-1]).group(1))


def _mean_spread(values):
    """'mean ± sample standard deviation' over seeds (just the value for one seed)."""
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def summarize(rows, args, counts):
    by_variant = {}
    for row in rows:
        by_variant.setdefault(row["model"], []).append(row)
    lines = [f"Reduced-scale reproduction, IWSLT16 de-en sample, {args.budget} budget, seeds {args.seeds}: "
             f"train {counts['train']} pairs, test TED tst2014 ({counts['test']} sentences)", "",
             "| model | tok BLEU | sacreBLEU | chrF | valid ppl | train time | seeds |", "|---|---|---|---|---|---|---|"]
    for variant, group in by_variant.items():
        perplexities = [r["valid_ppl"] for r in group if r.get("valid_ppl") is not None]
        lines.append(
            f"| {variant} | {_mean_spread([r['bleu_tok'] for r in group])} | {_mean_spread([r['bleu'] for r in group])} "
            f"| {_mean_spread([r['chrf'] for r in group])} | {_mean_spread(perplexities) if perplexities else '-'} "
            f"| {pipeline.format_seconds(statistics.mean(r['train_seconds'] for r in group))} | {len(group)} |")
    lines += ["", "valid ppl: perplexity on TED tst2013 after the last epoch (before checkpoint averaging).",
              "", "Per run (density: mean fraction of keys with nonzero weight; alpha: mean (min-max) over heads):", "",
              pipeline.format_table([dict(r, model=f"{r['model']} seed {r['seed']}") for r in rows], bleu_tok=True), "",
              f"tok BLEU: {rows[0]['bleu_tok_signature']} (Moses-tokenised, as the paper)",
              f"sacreBLEU: {rows[0]['bleu_signature']}", f"chrF: {rows[0]['chrf_signature']}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
