"""Reduced-scale reproduction of Correia et al. (2019) on real data that fits a CPU.

Does sparse attention cost accuracy? Softmax, 1.5-entmax and learned alpha-entmax (the paper's
three; top-k with k = 8 on request) small Transformers, trained with the same size, data and
schedule, several seeds each, then evaluated on the test set: tokenized BLEU, sacreBLEU, chrF,
paired bootstrap resampling against softmax, training time, validation learning curves,
attention density, head diversity and learned alphas. See docs/reproduction.md.

    # converged: Multi30k de-en, trained until validation accuracy stops improving
    .venv/bin/python -m examples.reproduction.reduced_scale
    # the early-training point: TED sample, 1600 updates
    .venv/bin/python -m examples.reproduction.reduced_scale --budget early
    .venv/bin/python -m examples.reproduction.reduced_scale --budget tiny     # every stage in minutes

Resumable: rerun the same command after an interruption; finished models are not retrained.
"""

import argparse
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path

from examples.pipeline.attention_analysis import analyze
from examples.pipeline.corpus import SPLITS, check_parallel_corpus, read_lines
from examples.pipeline.dataset import build_dataset
from examples.pipeline.evaluation import train_and_evaluate
from examples.pipeline.markers import done_with, mark_done
from examples.pipeline.tables import format_seconds, format_table
from examples.pipeline.tokenization import detokenize_lines
from examples.pipeline.tools import log, run_reporting_errors
from examples.pipeline.training import VARIANTS, TrainSettings, model_size_args

REPO = Path(__file__).resolve().parents[2]

SHARED_DATA = REPO.parent / "shared" / "data"
SRC, TGT = "de", "en"
PAPER_VARIANTS = ("softmax", "entmax15", "alpha_entmax")

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
# The recipes before the paper-fidelity review: post-norm, no attention or activation dropout.
EARLY_ARCHITECTURE = {
    "normalize_before": False,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "adam_betas": (0.9, 0.98),
    "adam_eps": 1e-8,
    "weight_decay": 0.0001,
    "best_metric": "loss",
}

# "converged": Multi30k de-en (29k short captions), a 3+3-layer model of width 128, trained
#   until validation accuracy has not improved for `patience` epochs (the update cap is a
#   safety net, not the stopping rule), evaluated with the best checkpoint. Sized from a pilot
#   (docs/reproduction.md).
# "early": the early-training point of 2026-11-29 (TED sample, 1600 updates, ~5 epochs, the
#   average of the last 3 states), with the recipe of that day.
# "tiny": the converged budget's stages in minutes, to check the script.
BUDGETS = {
    "converged": {
        "data": "multi30k",
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
    "early": {
        "data": "iwslt16_de_en_sample",
        "bpe_merges": 8000,
        "layers": 3,
        "dim": 128,
        "ffn": 512,
        "heads": 4,
        "max_update": 1600,
        "patience": 0,
        "max_tokens": 2048,
        "lr": 2e-3,
        "warmup": 400,
        "dropout": 0.1,
        "select": "average",
        "average": 3,
        "architecture": EARLY_ARCHITECTURE,
        "analysis_subset": "test",
        "retokenize": False,
        "train_lines": None,
        "test_lines": None,
        "analysis_sentences": 500,
        "max_len": None,
    },
    "tiny": {
        "data": "iwslt16_de_en_sample",
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
        "test_lines": 100,
        "analysis_sentences": None,
        # a barely trained model would otherwise spend fairseq's default 200 tokens on
        # every sentence
        "max_len": (1.2, 10),
    },
}


def parse_args(argv=None):
    """The reproduction's command line.

    Args:
        argv: the arguments (default: sys.argv[1:]).

    Returns:
        An argparse.Namespace, `data` filled in with the budget's corpus when not given.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", choices=sorted(BUDGETS), default="converged")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds per variant (default: 1 2 3)")
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(PAPER_VARIANTS),
        choices=VARIANTS,
        help="attention variants (default: the paper's three; topk is k = 8; sparsemax for the speed comparison)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        help="a folder with train/valid/test.{de,en} (default: the budget's "
        "corpus in ../shared/data: multi30k for converged, iwslt16_de_en_sample otherwise)",
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
    parser.add_argument("--threads", type=int, help="CPU threads per fairseq process")
    args = parser.parse_args(argv)
    if args.data is None:
        args.data = SHARED_DATA / BUDGETS[args.budget]["data"]
    return args


def main(argv=None):
    """The reproduction, as `python -m examples.reproduction.reduced_scale` runs it.

    Args:
        argv: the arguments (default: sys.argv[1:]).

    Returns:
        The exit status: 0, or 2 (1 for a failing tool) with a message.
    """
    return run_reporting_errors(run, parse_args(argv))


def _take_lines(in_path, out_path, n):
    lines = read_lines(in_path)
    Path(out_path).write_text("\n".join(lines[:n] if n else lines) + "\n", encoding="utf-8")


def budget_settings(budget):
    """The TrainSettings of a budget.

    Args:
        budget: an entry of BUDGETS, after the command line's overrides.

    Returns:
        A TrainSettings.
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
    """Every stage, then the report, printed and written to the work dir's results.md.

    Args:
        args: the command line, as parse_args returns it.
    """
    budget = dict(BUDGETS[args.budget])
    for option in ("max_update", "patience", "lr"):
        if getattr(args, option) is not None:
            budget[option] = getattr(args, option)
    work = (args.work_dir or REPO / "runs" / f"reproduction-{args.budget}").resolve()
    started = time.time()
    files = {s: (args.data / f"{s}.{SRC}", args.data / f"{s}.{TGT}") for s in SPLITS}
    check_parallel_corpus(files)

    raw_dir = work / "raw"
    limits = {"train": budget["train_lines"], "valid": budget["test_lines"], "test": budget["test_lines"]}
    # A corpus prepared from other data or with other limits is refused, not reused.
    prepared_from = {"data": str(args.data.resolve()), "lines": limits}
    if not done_with(raw_dir / "prepare.done", prepared_from, "the prepared corpus"):
        raw_dir.mkdir(parents=True, exist_ok=True)
        for split, pair in files.items():
            for lang, path in zip((SRC, TGT), pair):
                _take_lines(path, raw_dir / f"{split}.{lang}", limits[split])
        mark_done(raw_dir / "prepare.done", settings=prepared_from)
    counts = check_parallel_corpus({s: (raw_dir / f"{s}.{SRC}", raw_dir / f"{s}.{TGT}") for s in SPLITS})
    log(f"{args.data.name} ({args.budget} budget): " + ", ".join(f"{s} {n} pairs" for s, n in counts.items()))

    text_dir, data_bin = build_dataset(raw_dir, SRC, TGT, work, budget["bpe_merges"])
    settings = budget_settings(budget)
    references_tok = read_lines(text_dir / f"test.{TGT}")
    references_raw = read_lines(raw_dir / f"test.{TGT}")
    runs = [(variant, seed) for seed in args.seeds for variant in args.models]
    rows = []
    for i, (variant, seed) in enumerate(runs, 1):
        row = train_and_evaluate(
            data_bin,
            work,
            variant,
            seed,
            settings,
            references_tok,
            references_raw,
            TGT,
            label=f"{variant} seed {seed} [{i}/{len(runs)}]",
            select=budget["select"],
            threads=args.threads,
            lenpen=budget.get("lenpen", 1.0),
            max_len=budget["max_len"],
            retokenize=budget["retokenize"],
        )
        row.update(training_summary(Path(row["checkpoint"]).parent / "train.log"))
        rows.append(row)

    names = {f"{r['model']}-seed{r['seed']}": r for r in rows}
    analysis = analyze(
        data_bin,
        {name: r["checkpoint"] for name, r in names.items()},
        budget.get("analysis_subset", "valid"),
        work / "analysis",
        work / "analysis.log",
        num_sentences=budget["analysis_sentences"],
    )
    for name, row in names.items():
        row.update((analysis or {}).get(name, {}))

    _quiet_libraries()
    significance = paired_bootstrap(rows, work, references_raw)
    curves = {name: validation_curve(Path(r["checkpoint"]).parent / "train.log") for name, r in names.items()}
    figure = learning_curves_figure(curves, work / "learning_curves.png")
    report = summarize(rows, args, counts, budget, significance, figure)
    (work / "results.json").write_text(
        json.dumps({"runs": rows, "paired_bootstrap": significance, "validation_curves": curves}, indent=1) + "\n"
    )
    (work / "results.md").write_text(report + "\n")
    print()
    print(report)
    print(f"\nresults: {work / 'results.md'}; total time {format_seconds(time.time() - started)}")


def _quiet_libraries():
    """Importing fairseq_entmax imports fairseq, which sets the root logger to INFO: keep
    sacreBLEU's and matplotlib's chatter out of the report."""
    for name in ("sacrebleu", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)


def validation_curve(train_log):
    """The run's validations, as fairseq logged them.

    Args:
        train_log: fairseq-train's log file.

    Returns:
        The curve, as fairseq_entmax.analysis.training_log.read_validation_curve returns it.
    """
    from fairseq_entmax.analysis.training_log import read_validation_curve

    return read_validation_curve(train_log)


def training_summary(train_log):
    """What fairseq's log says of a finished training.

    Args:
        train_log: fairseq-train's log file.

    Returns:
        {"stopped_early", "updates", "epochs", "valid_ppl"} (the last validation's), and with
        a logged accuracy "best_update", "best_valid_accuracy", "best_valid_ppl" (best =
        highest accuracy, the checkpoint_best.pt fairseq kept); None for what the log lacks.
    """
    text = Path(train_log).read_text(encoding="utf-8", errors="replace")
    curve = validation_curve(train_log)
    summary = {
        "stopped_early": "early stop since valid performance hasn't improved" in text,
        "updates": curve["num_updates"][-1] if curve else None,
        "epochs": len(set(re.findall(r"\| valid \| epoch (\d+)", text))) or None,
        "valid_ppl": curve["ppl"][-1] if curve and "ppl" in curve else None,
    }
    if curve and "accuracy" in curve:
        best = max(range(len(curve["accuracy"])), key=curve["accuracy"].__getitem__)
        summary.update(
            best_update=curve["num_updates"][best],
            best_valid_accuracy=curve["accuracy"][best],
            best_valid_ppl=curve["ppl"][best],
        )
    return summary


def paired_bootstrap(rows, work, references_raw, n_samples=1000):
    """sacreBLEU's paired bootstrap resampling (--paired-bs, its fixed seed) of each sparse
    variant against softmax of the same seed, on the detokenised test translations.

    Args:
        rows: the result rows (train_and_evaluate's), with their hypotheses files.
        work: the work folder.
        references_raw: the test references as the corpus has them.
        n_samples: the bootstrap samples.

    Returns:
        A list of dicts, one per seed and sparse variant: seed, model, baseline, bleu,
        bleu_baseline, bleu_p, chrf, chrf_baseline, chrf_p (p: the p-value of the difference).
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
    """The learning curves figure: validation perplexity and accuracy per update, mean over
    seeds per variant.

    Args:
        curves: {run name ("<variant>-seed<N>"): validation curve}.
        path: the PNG to write.

    Returns:
        `path`, or None when no curve has a validation.
    """
    from fairseq_entmax.analysis.plots import plot_learning_curves
    from fairseq_entmax.analysis.training_log import group_by_variant

    return plot_learning_curves(group_by_variant(curves.items()), path)


def _mean_spread(values, digits=2):
    """'mean ± sample standard deviation' over seeds (just the value for one seed)."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def summarize(rows, args, counts, budget, significance, figure):
    """The report: the table per variant (mean ± spread over seeds), the paired bootstrap, the
    table per run and the signatures.

    Args:
        rows: the result rows, with the analysis and the training summary.
        args: the command line.
        counts: {split: number of pairs}.
        budget: the budget run, after overrides.
        significance: paired_bootstrap's results ([]: none).
        figure: the learning curves' path, or None.

    Returns:
        The report, Markdown.
    """
    by_variant = {}
    for row in rows:
        by_variant.setdefault(row["model"], []).append(row)
    selection = {
        "best": "the best checkpoint (validation accuracy)",
        "last": "the last checkpoint",
        "average": f"the average of the last {budget['average']} checkpoints",
    }[budget["select"]]
    lines = [
        f"Reduced-scale reproduction, {args.data.name}, {args.budget} budget, seeds {args.seeds}: "
        f"train {counts['train']} pairs, test {counts['test']} sentences; evaluated with {selection}",
        "",
        "| model | tok BLEU | sacreBLEU | chrF | valid ppl | valid accuracy | updates | stopped by | train time "
        "| seeds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for variant, group in by_variant.items():
        stops = sorted({"patience" if r.get("stopped_early") else "cap" for r in group})
        lines.append(
            f"| {variant} | {_mean_spread([r['bleu_tok'] for r in group])} "
            f"| {_mean_spread([r['bleu'] for r in group])} "
            f"| {_mean_spread([r['chrf'] for r in group])} "
            f"| {_mean_spread([r.get('best_valid_ppl', r.get('valid_ppl')) for r in group])} "
            f"| {_mean_spread([r.get('best_valid_accuracy') for r in group])} "
            f"| {_mean_spread([r.get('updates') for r in group], digits=0)} | {', '.join(stops)} "
            f"| {format_seconds(statistics.mean(r['train_seconds'] for r in group))} | {len(group)} |"
        )
    lines += [
        "",
        "valid ppl / accuracy: at the validation of the best accuracy (the evaluated checkpoint when the "
        "selection is the best one); updates: trained in all; stopped by: the patience or the update cap.",
    ]
    if significance:
        lines += [
            "",
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
