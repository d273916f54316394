"""Reduced-scale reproduction of Correia et al. (2019) on real data that fits a CPU.

Does sparse attention cost accuracy? Softmax, 1.5-entmax and learned alpha-entmax (the paper's
three; top-k with k = 8 and sparsemax on request) small Transformers, trained with the same
size, data and schedule, several seeds each, then evaluated on the test set: tokenized BLEU,
sacreBLEU, chrF, the difference to softmax paired by seed with its 95% interval, paired
bootstrap resampling against softmax, training time, validation learning curves, attention
density, head diversity, specialised heads and learned alphas. See docs/reproduction.md.

    # converged: Multi30k de-en, trained until validation accuracy stops improving
    .venv/bin/python -m examples.reproduction.reduced_scale
    # a normalizer with seeds of its own: NORMALIZER:SEED[,SEED...]
    .venv/bin/python -m examples.reproduction.reduced_scale --models softmax topk sparsemax:1
    .venv/bin/python -m examples.reproduction.reduced_scale --budget tiny     # every stage in minutes
    .venv/bin/python -m examples.reproduction.reduced_scale --dry-run         # every step, nothing run

Resumable: rerun the same command after an interruption; finished models are not retrained.
"""

import argparse
import functools
import json
import logging
import statistics
import sys
import time
from pathlib import Path

from examples.reproduction import multi30k
from fairseq_entmax.names import NORMALIZER_NAMES
from fairseq_entmax.pipeline.attention_analysis import analysis_step
from fairseq_entmax.pipeline.corpus import SPLITS, check_parallel_corpus, read_lines, write_first_lines
from fairseq_entmax.pipeline.dataset import dataset_steps
from fairseq_entmax.pipeline.evaluation import Decoding, Model, References, model_steps
from fairseq_entmax.pipeline.markers import done_with, mark_done
from fairseq_entmax.pipeline.runner import call_step, dry_run, run_steps
from fairseq_entmax.pipeline.seeds import (
    BASELINE,
    PAIRED_METRICS,
    mean_spread,
    paired_differences,
    paired_differences_section,
)
from fairseq_entmax.pipeline.tables import format_seconds, format_table
from fairseq_entmax.pipeline.tokenization import detokenize_lines
from fairseq_entmax.pipeline.tools import log, recording_commands, run_reporting_errors, use_cpu
from fairseq_entmax.pipeline.training import TrainSettings, model_size_args

REPO = Path(__file__).resolve().parents[2]
SRC, TGT = "de", "en"
PAPER_NORMALIZERS = ("softmax", "entmax15", "alpha_entmax")

# The paper's recipe scaled down (examples/translation/tasks.py has the full-size one):
# pre-norm, dropout 0.1 on the residuals, the attention weights and the ReLU output, Adam
# (0.9, 0.998) with eps 1e-9 and no weight decay, inverse square root after a linear warm-up,
# validation accuracy as the model-selection metric. Sizes and budgets per budget below.
PAPER_ARCHITECTURE = {
    "normalize_before": True,
    "attention_dropout": 0.1,
    "activation_dropout": 0.1,
    "adam_betas": (0.9, 0.998),
    "adam_eps": 1e-9,
    "weight_decay": 0.0,
    "best_metric": "accuracy",
}

# "converged": Multi30k de-en (29k short captions), a 3+3-layer model of width 128, trained
#   until validation accuracy has not improved for `patience` epochs (the update cap is a
#   safety net, not the stopping rule), evaluated with the best checkpoint. Sized from a pilot
#   (docs/reproduction.md).
# "tiny": the converged budget's stages in minutes, to check the script.
BUDGETS = {
    "converged": {
        "bpe_merges": 6000,
        "layers": 3,
        "dim": 128,
        "ffn": 512,
        "heads": 4,
        "max_update": 2500,
        "patience": 3,
        "max_tokens": 2048,
        "lr": 2e-3,
        "warmup": 400,
        "dropout": 0.1,
        "select": "best",
        "average": 5,
        "architecture": PAPER_ARCHITECTURE,
        "lenpen": 0.0,
        "retokenize": True,
        "train_lines": 10000,
        "test_lines": None,
        "analysis_sentences": None,
        "max_len": None,
    },
    "tiny": {
        "bpe_merges": 500,
        "layers": 1,
        "dim": 64,
        "ffn": 128,
        "heads": 4,
        "max_update": 60,
        "patience": 3,
        "max_tokens": 2048,
        "lr": 1e-3,
        "warmup": 20,
        "dropout": 0.1,
        "select": "best",
        "average": 2,
        "architecture": PAPER_ARCHITECTURE,
        "retokenize": True,
        "train_lines": 2000,
        "test_lines": 50,
        "analysis_sentences": None,
        # a barely trained model would otherwise spend fairseq's default 200 tokens on
        # every sentence
        "max_len": (1.2, 10),
    },
}


def model_spec(text):
    """One --models entry: a normalizer, or a normalizer with its own seeds ("sparsemax:1", "topk:1,3"), which
    replace --seeds for it.

    Args: text: the entry as given.
    Returns: (normalizer, seeds): seeds a tuple of ints, or None for those of --seeds.
    Raises argparse.ArgumentTypeError: an unknown normalizer or a seed that is not an integer.
    """
    normalizer, _, seeds = text.partition(":")
    if normalizer not in NORMALIZER_NAMES:
        raise argparse.ArgumentTypeError(
            f"unknown normalizer {normalizer!r}: choose from {', '.join(NORMALIZER_NAMES)}"
        )
    if not seeds:
        return normalizer, None
    try:
        return normalizer, tuple(int(seed) for seed in seeds.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: seeds after ':' are integers separated by commas") from None


def planned_runs(models, seeds):
    """The (normalizer, seed) pairs to train and report.

    Args: models: model_spec's (normalizer, seeds or None) pairs, in the order given; seeds: the seeds of the
    normalizers given without their own.
    Returns: The pairs, seed by seed (the models of seed 1 first, as the trainings run), each normalizer in
    the order given, without repeats.
    """
    wanted = []
    for normalizer, own_seeds in models:
        for seed in own_seeds or seeds:
            if (normalizer, seed) not in wanted:
                wanted.append((normalizer, seed))
    order = {normalizer: i for i, (normalizer, _) in enumerate(models)}
    return sorted(wanted, key=lambda run: (run[1], order[run[0]]))


def parse_args(argv=None):
    """The reproduction's command line.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: An argparse.Namespace (`data` None: Multi30k from the cache).
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="converged")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per normalizer (default: 1 2 3)")
    parser.add_argument(
        "--models",
        nargs="+",
        type=model_spec,
        default=[(normalizer, None) for normalizer in PAPER_NORMALIZERS],
        metavar="NORMALIZER[:SEEDS]",
        help=f"normalizers, of {', '.join(NORMALIZER_NAMES)} (default: the paper's three; topk is k = 8); "
        "NORMALIZER:1,2 trains and reports that normalizer with seeds 1 and 2 instead of --seeds",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="a folder with train/valid/test.{de,en} (default: Multi30k task 1, downloaded once into --cache-dir)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=multi30k.DEFAULT_CACHE,
        help="where Multi30k is downloaded to and read from, without --data (default: %(default)s)",
    )
    parser.add_argument(
        "--download-from",
        default=multi30k.OFFICIAL_SOURCE,
        metavar="URL_OR_DIR",
        help="where Multi30k's official <file>.gz are, a URL or a folder (default: %(default)s)",
    )
    parser.add_argument("--work-dir", type=Path, help="default: runs/reproduction-<budget>")
    parser.add_argument(
        "--max-update", type=int, help="cap on the training updates of every model (default: per budget)"
    )
    parser.add_argument(
        "--patience",
        type=int,
        help="stop a model after this many epochs without a better "
        "validation accuracy (default: per budget; 0: train to the cap)",
    )
    parser.add_argument("--lr", type=float, help="peak learning rate (default: per budget)")
    parser.add_argument("--threads", type=int, help="CPU threads of each fairseq command")
    parser.add_argument("--dry-run", action="store_true", help="print every step, one per line, and run nothing")
    return parser.parse_args(argv)


def main(argv=None):
    """The reproduction, as `python -m examples.reproduction.reduced_scale` runs it.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: The exit status: 0, or 2 (1 for a failing tool) with a message.
    """
    return run_reporting_errors(run, parse_args(argv))


def budget_settings(budget):
    """The TrainSettings of a budget.

    Args: budget: an entry of BUDGETS, after the command line's overrides.
    Returns: A TrainSettings.
    """
    return TrainSettings(
        arch="adaptively_sparse_transformer",
        max_update=budget["max_update"],
        max_tokens=budget["max_tokens"],
        lr=budget["lr"],
        warmup_updates=budget["warmup"],
        dropout=budget["dropout"],
        topk=8,
        keep_last_epochs=budget["average"],
        patience=budget["patience"],
        log_interval=100,
        **budget["architecture"],
        model_args=model_size_args(budget["layers"], budget["dim"], budget["ffn"], budget["heads"]),
    )


def run(args):
    """Every stage (or, with --dry-run, their lines), then the report, printed and written to the work dir's
    results.md. What ran is appended to the work dir's commands.log.

    Args: args: the command line, as parse_args returns it.
    """
    budget = dict(BUDGETS[args.budget])
    for option in ("max_update", "patience", "lr"):
        if getattr(args, option) is not None:
            budget[option] = getattr(args, option)
    work = (args.work_dir or REPO / "runs" / f"reproduction-{args.budget}").resolve()
    if args.data is not None:
        check_parallel_corpus({s: (args.data / f"{s}.{SRC}", args.data / f"{s}.{TGT}") for s in SPLITS})
    rows, done = [], {}
    steps = experiment_steps(args, budget, work, rows, done)
    if args.dry_run:
        dry_run(steps, f"# reduced-scale reproduction, {args.budget} budget; work dir {work}")
        return
    started = time.time()
    with recording_commands(work / "commands.log"):
        run_steps(steps)
    report(args, budget, work, rows, done)
    print(f"\nresults: {work / 'results.md'}; total time {format_seconds(time.time() - started)}")


def experiment_steps(args, budget, work, rows, done):
    """The reproduction's steps: the corpus, the dataset, every model, the analysis.

    Args: args: the command line; budget: the budget, with the command line's overrides; work: the work
    folder; rows: the list the models' score steps append their result rows to; done: a dict the steps fill:
    "counts" ({split: pairs}).
    Returns: The Steps, a list.
    """
    data, raw_dir = args.data or Path(args.cache_dir), work / "raw"
    steps = []
    if args.data is None:
        steps.append(
            call_step(
                f"# prepare: Multi30k task 1 from {args.download_from} -> {data} (multi30k.fetch_multi30k)",
                lambda: multi30k.fetch_multi30k(data, args.download_from),
            )
        )
    limits = {"train": budget["train_lines"], "valid": budget["test_lines"], "test": budget["test_lines"]}
    steps.append(
        call_step(
            f"# prepare: the first lines of {data}/{{train,valid,test}}.{{{SRC},{TGT}}} ({limits}) -> {raw_dir} "
            "(reduced_scale.prepare_corpus)",
            lambda: done.update(counts=prepare_corpus(data, raw_dir, limits, args.budget)),
        )
    )
    dataset, text_dir, data_bin = dataset_steps(raw_dir, SRC, TGT, work, budget["bpe_merges"])
    steps += dataset
    settings = budget_settings(budget)

    @functools.cache
    def references():
        tok, raw = read_lines(text_dir / f"test.{TGT}"), read_lines(raw_dir / f"test.{TGT}")
        return References(tok, raw, TGT, retokenize=budget["retokenize"])

    runs, select = planned_runs(args.models, args.seeds), budget["select"]
    decoding = Decoding(lenpen=budget.get("lenpen", 1.0), max_len=budget["max_len"])
    for i, (normalizer, seed) in enumerate(runs, 1):
        model = Model(normalizer, seed, label=f"{normalizer} seed {seed} [{i}/{len(runs)}]", threads=args.threads)
        steps += model_steps(data_bin, work, model, settings, references, rows, decoding, (select,), cpu=use_cpu())
    checkpoints = {
        f"{n}-seed{seed}": work / "models" / f"{n}-seed{seed}" / f"checkpoint_{select}.pt" for n, seed in runs
    }

    def add_to_rows(analysis):
        for row in rows:
            row.update((analysis or {}).get(f"{row['model']}-seed{row['seed']}", {}))

    out_dir, sentences = work / "analysis", budget["analysis_sentences"]
    steps.append(
        analysis_step(
            data_bin, checkpoints, "valid", out_dir, work / "analysis.log", add_to_rows, sentences, args.threads
        )
    )
    return steps


def prepare_corpus(data, raw_dir, limits, budget_name):
    """The first lines of each split of the corpus, in raw_dir (skipped when prepared from the same data and
    limits), checked.

    Args: data: the folder of train/valid/test.{de,en}; raw_dir: where the lines are written; limits: {split:
    lines, or None for all}; budget_name: the budget, for the log line.
    Returns: {split: pairs}.
    Raises PipelineError: the corpus is not line-aligned, or raw_dir was prepared from other data.
    """
    files = {s: (data / f"{s}.{SRC}", data / f"{s}.{TGT}") for s in SPLITS}
    check_parallel_corpus(files)
    # A corpus prepared from other data or with other limits is refused, not reused.
    prepared_from = {"data": str(Path(data).resolve()), "lines": limits}
    if not done_with(raw_dir / "prepare.done", prepared_from, "the prepared corpus"):
        write_first_lines(files, limits, raw_dir)
        mark_done(raw_dir / "prepare.done", settings=prepared_from)
    counts = check_parallel_corpus({s: (raw_dir / f"{s}.{SRC}", raw_dir / f"{s}.{TGT}") for s in SPLITS})
    log(f"{Path(data).name} ({budget_name} budget): " + ", ".join(f"{s} {n} pairs" for s, n in counts.items()))
    return counts


def report(args, budget, work, rows, done):
    """The report of a finished run: printed, and written to results.md and results.json.

    Args: args: the command line; budget: the budget, with the command line's overrides; work: the work
    folder; rows: the result rows, analysis included; done: what the steps recorded (experiment_steps).
    """
    references_raw = read_lines(work / "raw" / f"test.{TGT}")
    names = {f"{r['model']}-seed{r['seed']}": r for r in rows}
    _quiet_libraries()
    significance = paired_bootstrap(rows, work, references_raw)
    differences = {metric: paired_differences(rows, metric) for metric, _ in PAIRED_METRICS}
    curves = {name: validation_curve(Path(r["checkpoint"]).parent / "train.log") for name, r in names.items()}
    figure = learning_curves_figure(curves, work / "learning_curves.png")
    summary = summarize(rows, args, done["counts"], budget, significance, figure)
    results = {
        "runs": rows,
        "paired_differences": differences,
        "paired_bootstrap": significance,
        "validation_curves": curves,
    }
    (work / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (work / "results.md").write_text(summary + "\n")
    print()
    print(summary)


def _quiet_libraries():
    """Importing fairseq_entmax imports fairseq, which sets the root logger to INFO: keep sacreBLEU's and
    matplotlib's chatter out of the report.
    """
    for name in ("sacrebleu", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)


def validation_curve(train_log):
    """The run's validations, as fairseq logged them.

    Args: train_log: fairseq-train's log file.
    Returns: The curve, as fairseq_entmax.analysis.training_log.read_validation_curve returns it.
    """
    from fairseq_entmax.analysis.training_log import read_validation_curve

    return read_validation_curve(train_log)


def paired_bootstrap(rows, work, references_raw, n_samples=1000):
    """sacreBLEU's paired bootstrap resampling (--paired-bs, its fixed seed) of each sparse normalizer against
    softmax of the same seed, on the detokenised test translations.

    Args: rows: the result rows (evaluation.model_steps'), with their hypotheses files; work: the work folder;
    references_raw: the test references as the corpus has them; n_samples: the bootstrap samples.
    Returns: A list of dicts, one per seed and sparse normalizer: seed, model, baseline, bleu, bleu_baseline,
    bleu_p, chrf, chrf_baseline, chrf_p (p: the p-value of the difference).
    """
    from sacrebleu.metrics import BLEU, CHRF
    from sacrebleu.significance import PairedTest

    by_seed = {}
    for row in rows:
        hypotheses = read_lines(Path(row["hypotheses"]))
        by_seed.setdefault(row["seed"], {})[row["model"]] = detokenize_lines(hypotheses, TGT)
    results = []
    for seed, systems in sorted(by_seed.items()):
        if "softmax" not in systems or len(systems) < 2:
            continue
        named = [("softmax", systems["softmax"])] + [(m, h) for m, h in systems.items() if m != "softmax"]
        _, scores = PairedTest(
            named, {"BLEU": BLEU(), "chrF": CHRF()}, [references_raw], test_type="bs", n_samples=n_samples
        )()
        chrf_key = next(k for k in scores if k.startswith("chrF"))
        for i, (model, _) in enumerate(named[1:], 1):
            results.append(
                {
                    "seed": seed,
                    "model": model,
                    "baseline": "softmax",
                    "bleu": float(scores["BLEU"][i].score),
                    "bleu_baseline": float(scores["BLEU"][0].score),
                    "bleu_p": float(scores["BLEU"][i].p_value),
                    "chrf": float(scores[chrf_key][i].score),
                    "chrf_baseline": float(scores[chrf_key][0].score),
                    "chrf_p": float(scores[chrf_key][i].p_value),
                }
            )
    return results


def learning_curves_figure(curves, path):
    """The learning curves figure: validation perplexity and accuracy per update, mean over seeds per normalizer.

    Args: curves: {run name ("<normalizer>-seed<N>"): validation curve}; path: the PNG to write.
    Returns: `path`, or None when no curve has a validation.
    """
    from fairseq_entmax.analysis.plots import plot_learning_curves
    from fairseq_entmax.analysis.training_log import group_by_normalizer

    return plot_learning_curves(group_by_normalizer(curves.items()), path)


_SHORT = {"encoder_self": "enc", "decoder_self": "dec", "cross": "cross"}
SPECIALISED_HEADS = (("positional", "positional"), ("bpe_merging", "BPE-merging"), ("interrogation", "interrogation"))


def heads_table(by_normalizer):
    """The attention analysis per normalizer: density and head diversity per attention type, and the specialised
    heads found, each the mean ± standard deviation over seeds.

    Args: by_normalizer: {normalizer: its result rows}, with the analysis's density, js and specialised_heads
    (fairseq_entmax.pipeline.attention_analysis.analyze).
    Returns: The Markdown lines; empty when no row has an analysis.
    """
    from fairseq_entmax.names import ATTENTION_TYPES

    if not any(r.get("density") for group in by_normalizer.values() for r in group):
        return []
    header = [f"density {_SHORT[t]}" for t in ATTENTION_TYPES] + [f"JS {_SHORT[t]}" for t in ATTENTION_TYPES]
    header += [f"{title} heads" for _, title in SPECIALISED_HEADS]
    lines = ["| model | " + " | ".join(header) + " | seeds |", "|---|" + "---|" * (len(header) + 1)]
    for normalizer, group in by_normalizer.items():
        cells = [mean_spread([(r.get("density") or {}).get(t) for r in group], 3) for t in ATTENTION_TYPES]
        cells += [mean_spread([(r.get("js") or {}).get(t) for r in group], 3) for t in ATTENTION_TYPES]
        cells += [
            mean_spread([(r.get("specialised_heads") or {}).get(kind) for r in group], 1)
            for kind, _ in SPECIALISED_HEADS
        ]
        lines.append(f"| {normalizer} | " + " | ".join(cells) + f" | {len(group)} |")
    return lines


def group_by_model(rows, baseline=BASELINE):
    """The result rows per normalizer, the baseline first, then in the order of the rows.

    Args: rows: the result rows; baseline: the normalizer put first.
    Returns: {normalizer: [rows]}.
    """
    by_normalizer = {}
    for row in sorted(rows, key=lambda r: r["model"] != baseline):
        by_normalizer.setdefault(row["model"], []).append(row)
    return by_normalizer


def normalizer_rows(by_normalizer):
    """The rows of the report's table per normalizer: mean ± spread over its seeds.

    Args: by_normalizer: {normalizer: [result rows]} (group_by_model).
    Returns: Markdown table rows, one per normalizer.
    """
    lines = []
    for normalizer, group in by_normalizer.items():
        stops = sorted({"patience" if r.get("stopped_early") else "cap" for r in group})
        lines.append(
            f"| {normalizer} | {mean_spread([r['bleu_tok'] for r in group])} "
            f"| {mean_spread([r['bleu'] for r in group])} "
            f"| {mean_spread([r['chrf'] for r in group])} "
            f"| {mean_spread([r.get('best_valid_accuracy') for r in group])} "
            f"| {mean_spread([r.get('best_valid_ppl', r.get('valid_ppl')) for r in group])} "
            f"| {mean_spread([r.get('best_update') for r in group], digits=0)} "
            f"| {mean_spread([r.get('updates') for r in group], digits=0)} | {', '.join(stops)} "
            f"| {format_seconds(statistics.mean(r['train_seconds'] for r in group))} | {len(group)} |"
        )
    return lines


def significance_table(significance):
    """The paired bootstrap against softmax, for the report.

    Args: significance: paired_bootstrap's results, not empty.
    Returns: Lines: the heading sentence, a blank line and a Markdown table.
    """
    lines = [
        "Paired bootstrap resampling against softmax of the same seed (sacreBLEU, 1000 samples, "
        "detokenised test translations):",
        "",
        "| seed | model | BLEU | softmax BLEU | p | chrF | softmax chrF | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['seed']} | {r['model']} | {r['bleu']:.2f} | {r['bleu_baseline']:.2f} | {r['bleu_p']:.4f} "
        f"| {r['chrf']:.2f} | {r['chrf_baseline']:.2f} | {r['chrf_p']:.4f} |"
        for r in significance
    ]
    return lines


def summarize(rows, args, counts, budget, significance, figure):
    """The report: the table per normalizer (mean ± spread over seeds), the differences to softmax paired by seed
    with their intervals, the paired bootstrap, the attention analysis per normalizer, the table per run and
    the signatures.

    Args: rows: the result rows, with the analysis and the training summary; args: the command line; counts:
    {split: number of pairs}; budget: the budget run, after overrides; significance: paired_bootstrap's
    results ([]: none); figure: the learning curves' path, or None.
    Returns: The report, Markdown.
    """
    by_normalizer = group_by_model(rows)
    selection = {
        "best": "the best checkpoint (validation accuracy)",
        "last": "the last checkpoint",
        "average": f"the average of the last {budget['average']} checkpoints",
    }[budget["select"]]
    seeds = "; ".join(f"{v} {', '.join(str(r['seed']) for r in group)}" for v, group in by_normalizer.items())
    lines = [
        f"Reduced-scale reproduction, {args.data.name}, {args.budget} budget, seeds: {seeds}; "
        f"train {counts['train']} pairs, test {counts['test']} sentences; evaluated with {selection}",
        "",
        "| model | tok BLEU | sacreBLEU | chrF | valid accuracy | valid ppl | best update | updates | stopped by "
        "| train time | seeds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += normalizer_rows(by_normalizer)
    lines += [
        "",
        "Mean ± sample standard deviation over seeds. valid accuracy / ppl: at the validation of the best "
        "accuracy (the evaluated checkpoint when the selection is the best one); best update: the update of "
        "that validation; updates: trained in all; stopped by: the patience or the update cap.",
    ]
    lines += paired_differences_section(rows)
    if significance:
        lines += ["", *significance_table(significance)]
    heads = heads_table(by_normalizer)
    if heads:
        lines += [
            "",
            "Attention analysis on the validation set (fairseq-entmax-analyze; density: mean fraction of keys "
            "with nonzero weight; JS: head diversity, mean over layers; specialised heads: the number per model "
            "above the analysis's thresholds):",
            "",
            *heads,
        ]
    lines += [
        "",
        "Per run (density: mean fraction of keys with nonzero weight; alpha: mean (min-max) over heads):",
        "",
        format_table([dict(r, model=f"{r['model']} seed {r['seed']}") for r in rows], bleu_tok=True),
        "",
        f"tok BLEU: {rows[0]['bleu_tok_signature']} (multi-bleu on Moses-tokenised text"
        + (", without hyphen splitting)" if budget["retokenize"] else ", hyphens split as in training)"),
        f"sacreBLEU: {rows[0]['bleu_signature']}",
        f"chrF: {rows[0]['chrf_signature']}",
    ]
    if figure:
        lines += ["", f"learning curves: {figure}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
