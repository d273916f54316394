"""Quickstart (`make demo`): softmax, 1.5-entmax, learned alpha-entmax and top-k attention,
trained and compared end to end with fairseq on a toy language pair, on a CPU in minutes.

    .venv/bin/python -m examples.quickstart.quickstart                  # the toy pair, minutes on 2 cores
    .venv/bin/python -m examples.quickstart.quickstart --data DIR --src de --tgt en   # your corpus

Stages: corpus (generated, or yours: DIR/{train,valid,test}.{src,tgt}, raw text, one sentence
per line) -> Moses tokenisation (your corpus only) -> joint BPE (subword-nmt) ->
fairseq-preprocess -> fairseq-train per normalizer -> fairseq-generate on test ->
sacreBLEU BLEU and chrF -> fairseq-entmax-analyze (attention density, learned alphas,
figures) -> one table. Everything goes to --work-dir; a second run skips finished stages and
resumes an interrupted training from its last checkpoint.

On your corpus, each model trains until its validation accuracy has not improved for 3 epochs
(--patience), under a cap on its updates sized to the corpus (own_corpus_max_update), and is
evaluated with its best checkpoint; BPE is sized to the corpus too (own_corpus_bpe_merges). The
plan is printed before training, after the first updates of each normalizer are timed on this
machine, with an estimate of the training time where the patience typically stops a model and
at the cap, and a warning when the cap is likely to stop the models before
they converge; each model's line then gives its own training rate, the first model done
projects the whole run's time from its measured cost, and the table says per model whether it
stopped on the patience or at the cap. --max-update and --bpe-merges override
the sizes. The toy pair trains every model for a fixed number of updates.
"""

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

from examples.quickstart.toy_language import write_toy_corpus
from fairseq_entmax.pipeline.attention_analysis import analysis_step
from fairseq_entmax.pipeline.corpus import SPLITS, check_parallel_corpus, read_lines
from fairseq_entmax.pipeline.dataset import dataset_steps
from fairseq_entmax.pipeline.evaluation import Decoding, Model, References, model_steps
from fairseq_entmax.pipeline.markers import is_done, mark_done
from fairseq_entmax.pipeline.runner import call_step, command_step, dry_run, run_steps
from fairseq_entmax.pipeline.tables import format_seconds, format_table
from fairseq_entmax.pipeline.tools import (
    PipelineError,
    log,
    recording_commands,
    run_logged,
    run_reporting_errors,
    use_cpu,
)
from fairseq_entmax.pipeline.training import TrainSettings, model_size_args, train_command

REPO = Path(__file__).resolve().parents[2]

# Sizes chosen so the whole demo fits well inside 10 minutes on 2 CPU cores and every model
# learns the toy pair (its measured time and table: docs/recipes.md); --tiny is the test
# suite's size.
SIZES = {
    "demo": {
        "n_train": 20000,
        "n_eval": 500,
        "bpe_merges": 300,
        "max_update": 200,
        "max_tokens": 4096,
        "warmup": 100,
        "layers": 2,
        "dim": 128,
        "ffn": 256,
        "heads": 4,
        "topk": 4,
    },
    "tiny": {
        "n_train": 600,
        "n_eval": 40,
        "bpe_merges": 100,
        "max_update": 20,
        "max_tokens": 1024,
        "warmup": 10,
        "layers": 1,
        "dim": 32,
        "ffn": 64,
        "heads": 2,
        "topk": 2,
    },
}

# Your own corpus (--data, without --tiny): the demo's post-norm recipe at the size of the
# reduced-scale reproduction's model (3+3 layers of width 128, batches of 2048 tokens, lr 2e-3
# after 400 warm-up updates; k = 8 for top-k), where the demo's sizes give a table that says
# nothing (docs/recipes.md, "Your own corpus"). BPE merges and the cap on updates follow the
# corpus (the two functions below); the warm-up is at most a quarter of the cap.
OWN_CORPUS = {"max_tokens": 2048, "warmup": 400, "layers": 3, "dim": 128, "ffn": 512, "heads": 4, "topk": 8}
MERGES_PER_TRAINING_PAIR, MERGES_RANGE = 0.5, (1000, 8000)
# On your corpus (--tiny too) a model stops once its validation accuracy has not improved for
# PATIENCE epochs, as in the reproduction: a fixed budget compares the normalizers early in
# training, where softmax leads and the sparse ones catch up later (docs/reproduction.md).
PATIENCE = 3
# Where the patience stopped the quickstart's models, measured on TED and Multi30k corpora of
# 2,000 to 19,689 pairs (examples.quickstart.convergence; docs/recipes.md, "How long a corpus
# takes to converge"): the runs, in the file that the tests read too.
CONVERGENCE_FILE = Path(__file__).with_name("convergence.json")


def passes_to_stop(path=CONVERGENCE_FILE):
    """The passes over the training data after which the patience stopped the measured models.

    Args: path: the measurements, a JSON file with max_tokens and runs of batch_tokens_per_pass and
    stopped_at_update.
    Returns: {"typical": their mean, "most": their maximum}, to a tenth of a pass.
    """
    measured = json.loads(Path(path).read_text(encoding="utf-8"))
    passes = [
        run["stopped_at_update"] * measured["max_tokens"] / run["batch_tokens_per_pass"] for run in measured["runs"]
    ]
    return {"typical": round(sum(passes) / len(passes), 1), "most": round(max(passes), 1)}


# The estimate assumes the typical stop, and the cap gives CAP_MARGIN times the most any model
# took, so that a corpus like those converges before it, while a corpus too large to converge
# still stops in bounded time.
PASSES_TO_STOP = passes_to_stop()
CAP_MARGIN, UPDATES_RANGE = 1.5, (1500, 12000)
# The normalizers the quickstart trains and compares (NORMALIZER_NAMES has sparsemax too).
NORMALIZERS = ("softmax", "entmax15", "alpha_entmax", "topk")
# The estimate times the first updates of each normalizer on the user's machine: fairseq-train of
# the run's model for TIMED_UPDATES updates, nothing saved, no validation, a log line every
# TIMED_LOG_INTERVAL; the rate is the mean of fairseq's updates per second after the first line
# (start-up and the first batches left out).
TIMED_UPDATES, TIMED_LOG_INTERVAL = 8, 2


def own_corpus_bpe_merges(n_training_pairs):
    """Joint BPE merges for a corpus. Fewer than the usual 32k: small corpora do better with small vocabularies,
    every subword seen often enough to be learnt.

    Args: n_training_pairs: the number of training sentence pairs.
    Returns: One merge per two training pairs, rounded to the thousand (halves up), from 1000 to 8000 (8000
    from 15,000 pairs up, as for the reproduction's TED sample).
    """
    merges = 1000 * math.floor(n_training_pairs * MERGES_PER_TRAINING_PAIR / 1000 + 0.5)
    return int(min(MERGES_RANGE[1], max(MERGES_RANGE[0], merges)))


def expected_updates(training_tokens, max_tokens=OWN_CORPUS["max_tokens"], passes=None):
    """The updates after which the patience typically stops a model on a corpus.

    Args: training_tokens: what a pass over the training data costs (count_training_tokens); max_tokens: the
    tokens of a batch; passes: passes over the training data (None: the typical measured figure).
    Returns: The updates, rounded up to the hundred.
    """
    passes = PASSES_TO_STOP["typical"] if passes is None else passes
    return int(100 * math.ceil(passes * training_tokens / max_tokens / 100))


def own_corpus_max_update(training_tokens, max_tokens=OWN_CORPUS["max_tokens"]):
    """The cap on the training updates of a model on a corpus (the patience stops it earlier).

    Args: training_tokens: what a pass over the training data costs (count_training_tokens); max_tokens: the
    tokens of a batch.
    Returns: CAP_MARGIN times the passes the slowest measured model took to stop, in batches of max_tokens,
    rounded up to the hundred, from 1,500 to 12,000 (which bounds the time: docs/recipes.md; --max-update
    gives more).
    """
    updates = expected_updates(training_tokens, max_tokens, CAP_MARGIN * PASSES_TO_STOP["most"])
    return int(min(UPDATES_RANGE[1], max(UPDATES_RANGE[0], updates)))


def count_training_tokens(bpe_dir, src, tgt):
    """What a pass over the training data costs in batch tokens.

    Args: bpe_dir: the folder of the BPE-segmented text (train.SRC, train.TGT); src: the source language
    suffix; tgt: the target language suffix.
    Returns: The sum over the training pairs of the longer side in BPE tokens plus its end-of-sentence token
    (fairseq pads a batch to its longest sentence).
    """
    sources, targets = read_lines(Path(bpe_dir) / f"train.{src}"), read_lines(Path(bpe_dir) / f"train.{tgt}")
    return sum(max(len(s.split()), len(t.split())) + 1 for s, t in zip(sources, targets))


def estimated_seconds(updates, rates):
    """The time the models' training updates take at their timed rates.

    Args: updates: training updates per model; rates: {normalizer: seconds per update on this machine}
    (timing_steps), one per model.
    Returns: The estimate in seconds, for all models together.
    """
    return sum(updates * rate for rate in rates.values())


def projected_seconds(elapsed, done, rates, remaining, updates):
    """The whole run's time, projected once its first model is trained and evaluated: the time so far, then each
    remaining model at the first one's measured cost, scaled by their timed rates (the analysis comes on top).

    Args: elapsed: seconds since the run started; done: (normalizer, updates, training seconds, evaluation
    seconds) of the model done; its training seconds include validation and checkpoints; rates: {normalizer:
    timed seconds per update} (timing_steps); remaining: the normalizers still to train; updates: the updates
    each of them is expected to train.
    Returns: Seconds.
    """
    name, done_updates, train_seconds, evaluation_seconds = done
    per_timed_second = train_seconds / (done_updates * rates[name])
    scale = {other: rates[other] / rates[name] for other in remaining}
    return elapsed + sum(
        updates * rates[other] * per_timed_second + evaluation_seconds * scale[other] for other in remaining
    )


def timing_steps(data_bin, work, settings, models, threads, cpu, rates):
    """Steps that time each normalizer's first updates on this machine; a rerun skips those of the models trained
    already.

    Args: data_bin: the run's data-bin; work: the work folder (the timing runs go to work/timing); settings:
    the run's TrainSettings; models: the normalizers; threads: fairseq-train's threads (--threads, or None for
    torch's choice); cpu: whether fairseq-train runs on the CPU; rates: the dict each step puts its
    normalizer's seconds per update in.
    Returns: The Steps, a list.
    """
    timing = dataclasses.replace(
        settings,
        max_update=TIMED_UPDATES,
        log_interval=TIMED_LOG_INTERVAL,
        patience=0,
        extra_args=[*settings.extra_args, "--no-save", "--disable-validation"],
    )
    steps = []
    for normalizer in models:
        log_path = work / "timing" / normalizer / "train.log"
        command = train_command(data_bin, log_path.parent, normalizer, timing, seed=1, cpu=cpu)

        def time_it(normalizer=normalizer, command=command, log_path=log_path):
            log(f"{normalizer}: timing its first {TIMED_UPDATES} updates")
            output = run_logged(command, log_path, threads=threads).output
            rates[normalizer] = timed_rate(output, log_path)

        trained = work / "models" / f"{normalizer}-seed1" / "train.done"
        steps.append(command_step(command, time_it, skip=trained.exists))
    return steps


def timed_rate(output, log_path):
    """Seconds per update from a timing run's log: the mean of 1 / fairseq's updates per second over its log
    lines after the first, the interval lines or, where an epoch is shorter than an interval, the epochs' own
    lines.

    Args: output: fairseq-train's output; log_path: its log file, for the message.
    Returns: Seconds per update.
    Raises PipelineError: the log gives no rate.
    """
    from fairseq_entmax.analysis.training_log import stats_of_line  # imports torch: only when timing

    stats = [found for found in map(stats_of_line, output.splitlines()) if found and "ups" in found[1]]
    speeds = [float(values["ups"]) for kind, values in stats if kind == "train_inner"]
    speeds = speeds or [float(values["ups"]) for kind, values in stats if kind == "train"]
    speeds = speeds[1:] or speeds
    if not speeds or min(speeds) <= 0:
        raise PipelineError(f"fairseq-train logged no training rate to time ({log_path})")
    return sum(1 / ups for ups in speeds) / len(speeds)


def training_threads(threads):
    """The threads fairseq-train gets: --threads, else torch's default in a new process."""
    if threads:
        return threads
    import torch  # here: the plan is the only part of the quickstart that needs it

    return torch.get_num_threads()


def planned_updates(size, training_tokens, patience):
    """The updates a model is expected to train: where the patience typically stops it, or the cap
    (size["max_update"]) where that comes first or there is no patience.
    """
    cap = size["max_update"]
    return min(cap, expected_updates(training_tokens, size["max_tokens"])) if patience else cap


def own_corpus_plan(size, counts, training_tokens, rates, max_update_given, patience=PATIENCE, threads=1):
    """The lines printed before training on a user's corpus: sizes, the time they take, and a warning when the
    cap is likely to stop the models before they converge.

    Args: size: the run's sizes (OWN_CORPUS with bpe_merges and max_update, the cap, filled in); counts:
    {split: number of pairs} of the corpus; training_tokens: what a pass over the training data costs
    (count_training_tokens); rates: {normalizer: seconds per update} of the models to train, timed on this
    machine (timing_steps); max_update_given: whether --max-update set the cap (the plan says so); patience:
    the epochs without a better validation accuracy that stop a model (0: none); threads: fairseq-train's
    threads (training_threads).
    Returns: Lines of text: the plan, the estimate, and the warning where it applies.
    """
    cap, merges, max_tokens = size["max_update"], size["bpe_merges"], size["max_tokens"]
    how = (
        "--max-update"
        if max_update_given
        else f"{CAP_MARGIN:g} x the {PASSES_TO_STOP['most']:g} passes the slowest measured model took to stop, "
        f"{UPDATES_RANGE[0]} to {UPDATES_RANGE[1]}"
    )
    stopping = (
        f"each model stops earlier once its validation accuracy has not improved for {patience} epochs "
        "and is evaluated with its best checkpoint"
        if patience
        else "every model trains to the cap (--patience 0) and is evaluated with its best checkpoint"
    )
    lines = [
        f"plan: {counts['train']} training pairs, {training_tokens} batch tokens per pass; {merges} "
        f"BPE merges; at most {cap} updates of {max_tokens} tokens per model, "
        f"{cap * max_tokens / training_tokens:.1f} passes over the training data ({how}); {stopping}; "
        f"{size['layers']}+{size['layers']} layers of width {size['dim']}"
    ]

    def total(updates):
        return format_seconds(estimated_seconds(updates, rates))

    typical = planned_updates(size, training_tokens, patience)
    stops = (
        f"about {total(typical)} for {len(rates)} model(s) if each stops near {typical} updates "
        f"({PASSES_TO_STOP['typical']:g} passes, where the patience typically stopped the measured models), "
        f"at most {total(cap)} at the cap"
        if typical < cap
        else f"about {total(cap)} for {len(rates)} model(s), each training to the cap of {cap} updates"
    )
    lines.append(
        f"estimate: {stops}; the training updates at the rates timed on this machine at {threads} thread(s) "
        "(--threads): "
        + ", ".join(f"{name} {rate:.3f}" for name, rate in rates.items())
        + " s per update; validation, translating the test set and the analysis come on top"
    )
    slowest = expected_updates(training_tokens, max_tokens, PASSES_TO_STOP["most"])
    if patience and cap < slowest:
        room = expected_updates(training_tokens, max_tokens, CAP_MARGIN * PASSES_TO_STOP["most"])
        lines.append(
            f"warning: the cap of {cap} updates is below the {slowest} ({PASSES_TO_STOP['most']:g} passes) that the "
            "slowest measured model needed before the patience stopped it: models may stop at the cap, "
            f"unconverged, which the table will say; --max-update {room} gives them room, at most {total(room)}"
        )
    return lines


def convergence_note(rows, max_update, patience=PATIENCE):
    """What the table says of how its models stopped.

    Args: rows: the result rows, with training_summary's stopped_early; max_update: the cap; patience: the
    epochs without a better validation accuracy that stop a model (0: none).
    Returns: A sentence; it says that the comparison is of unconverged models when any model stopped at the
    cap.
    """
    at_cap = [row["model"] for row in rows if not row.get("stopped_early")]
    if not at_cap:
        return (
            f"Every model stopped on the patience (validation accuracy not improved for {patience} epochs) "
            "and was evaluated with its best checkpoint."
        )
    why = (
        f"before its validation accuracy had gone {patience} epochs without improving"
        if patience
        else "(--patience 0: no convergence check)"
    )
    return (
        f"Not converged: {', '.join(at_cap)} stopped at the cap of {max_update} updates {why}, so this "
        "compares unconverged models: early in training softmax tends to lead and sparse attention to catch up "
        "later (docs/reproduction.md). A larger --max-update lets every model train until the patience stops it."
    )


def parse_args(argv=None):
    """The quickstart's command line.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: An argparse.Namespace; argparse exits with status 2 on a bad command line.
    """
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--data",
        type=Path,
        help="directory with your corpus: {train,valid,test}.{SRC,TGT}, "
        "raw text, one sentence per line (default: the generated toy pair)",
    )
    parser.add_argument("--src", help="source language code (file suffix), with --data")
    parser.add_argument("--tgt", help="target language code (file suffix), with --data")
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="where everything is written (default: runs/quickstart, or "
        "runs/quickstart-<data folder name>-<src>-<tgt> for your corpus; -tiny added with --tiny)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        default=list(NORMALIZERS),
        choices=NORMALIZERS,
        help="normalizers to train (default: all four)",
    )
    parser.add_argument(
        "--max-update",
        type=int,
        help="training updates per model (default: {} for the toy pair; with --data, the cap, sized to the "
        "corpus: see docs/recipes.md)".format(SIZES["demo"]["max_update"]),
    )
    parser.add_argument(
        "--patience",
        type=int,
        help=f"with --data: stop a model after this many epochs without a better validation accuracy "
        f"(default: {PATIENCE}; 0: train every model to the cap)",
    )
    parser.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    parser.add_argument(
        "--bpe-merges",
        type=int,
        help="BPE merge operations (default: {} for the toy pair; with --data, sized to the corpus)".format(
            SIZES["demo"]["bpe_merges"]
        ),
    )
    parser.add_argument("--tiny", action="store_true", help="a very small run (a few seconds per model), for tests")
    parser.add_argument("--threads", type=int, help="CPU threads of each fairseq command (default: torch's choice)")
    parser.add_argument("--dry-run", action="store_true", help="print every step, one per line, and run nothing")
    args = parser.parse_args(argv)
    if args.data is None and (args.src or args.tgt):
        parser.error("--src/--tgt name the files of your corpus: give --data DIR as well")
    if args.patience is not None and args.data is None:
        parser.error("--patience is for your corpus (--data): the toy pair trains for a fixed number of updates")
    if args.patience is not None and args.patience < 0:
        parser.error("--patience is a number of epochs, 0 or more")
    if args.data is not None:
        if not (args.src and args.tgt):
            parser.error("--data needs --src and --tgt, the language suffixes of its files (e.g. --src de --tgt en)")
        if args.src == args.tgt:
            parser.error(f"--src and --tgt are both {args.src!r}: give two different languages")
    return args


def main(argv=None):
    """The quickstart, as `python -m examples.quickstart.quickstart` runs it.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: The exit status: 0, or 2 with a message when an input or a stage fails.
    """
    return run_reporting_errors(run, parse_args(argv))


def run_size(args):
    """The sizes of this run: the toy pair's, --tiny's or a user's corpus's, with the command line's overrides.

    Args: args: the command line.
    Returns: A dict of sizes (SIZES' keys); a user's corpus gets bpe_merges and max_update once its size is
    known.
    """
    # Sized to the corpus: a user's corpus at full size (the toy pair and --tiny have fixed sizes).
    sized = args.data is not None and not args.tiny
    size = dict(OWN_CORPUS if sized else SIZES["tiny" if args.tiny else "demo"])
    if args.max_update:
        size["max_update"] = args.max_update
    if args.bpe_merges:
        size["bpe_merges"] = args.bpe_merges
    return size


def train_settings(args, size, patience):
    """The TrainSettings every normalizer trains with. On a user's corpus each model trains until its validation
    accuracy stops improving; the toy pair trains for its fixed updates.

    Args: args: the command line; size: the run's sizes, complete; patience: validations without a better
    accuracy before stopping (0: none).
    Returns: A TrainSettings.
    """
    stopping = {"patience": patience, "best_metric": "accuracy"} if args.data is not None else {}
    return TrainSettings(
        arch="adaptively_sparse_transformer",
        max_update=size["max_update"],
        max_tokens=size["max_tokens"],
        lr=args.lr,
        warmup_updates=size["warmup"],
        dropout=0.1,
        topk=size["topk"],
        keep_last_epochs=1,
        log_interval=max(1, size["max_update"] // 6),
        model_args=model_size_args(size["layers"], size["dim"], size["ffn"], size["heads"]),
        extra_args=["--no-epoch-checkpoints"],
        **stopping,
    )


def run(args):
    """Every stage (or, with --dry-run, their lines), then the table, printed and written to the work dir's
    results.md. What ran is appended to the work dir's commands.log.

    Args: args: the command line, as parse_args returns it.
    Raises PipelineError: a bad corpus, or a dry run on a corpus whose cap is to be sized.
    """
    own_corpus = args.data is not None
    patience = (PATIENCE if args.patience is None else args.patience) if own_corpus else 0
    size = run_size(args)
    # One default folder per corpus, direction and size: a run never finds another's models.
    name = "quickstart" + (f"-{args.data.resolve().name}-{args.src}-{args.tgt}" if own_corpus else "")
    work = (args.work_dir or REPO / "runs" / (name + ("-tiny" if args.tiny else ""))).resolve()
    corpus = Corpus.of(args, work)
    if own_corpus:
        corpus.counts = check_parallel_corpus(corpus.files())
        if not args.tiny:
            size.setdefault("bpe_merges", own_corpus_bpe_merges(corpus.counts["train"]))
    if args.dry_run:
        if own_corpus and not args.tiny and not args.max_update:
            raise PipelineError(
                "--dry-run on your corpus needs --max-update: the cap is sized from the BPE-segmented corpus, "
                "which a dry run does not make"
            )
        dry_run(quickstart_steps(args, work, size, patience, corpus, []), f"# quickstart; work dir {work}")
        return
    started, rows = time.time(), []
    if own_corpus:
        counted = ", ".join(f"{split} {n} lines" for split, n in corpus.counts.items())
        log(f"corpus {corpus.raw_dir} {corpus.src}->{corpus.tgt}: {counted}")
    work.mkdir(parents=True, exist_ok=True)
    with recording_commands(work / "commands.log"):
        run_steps(quickstart_steps(args, work, size, patience, corpus, rows))
    write_results(args, work, rows, corpus, size["max_update"], patience)
    if (work / "analysis" / "analysis.json").exists():
        print(f"Figures and CSV tables: {work / 'analysis'}")
    print(f"Everything is in {work} (results.md, results.json); total time {format_seconds(time.time() - started)}")


@dataclasses.dataclass
class Corpus:
    """The run's corpus: the user's, or the toy pair written into the work dir.

    Attributes: raw_dir: its folder, {train,valid,test}.{src,tgt}; src: the source language suffix; tgt: the
    target language suffix; counts: {split: lines}, once checked.
    """

    raw_dir: Path
    src: str
    tgt: str
    counts: dict = None

    @classmethod
    def of(cls, args, work):
        """The corpus of a command line: --data, or the toy pair in work/raw."""
        if args.data is not None:
            return cls(args.data, args.src, args.tgt)
        return cls(work / "raw", "svo", "sov")

    def files(self):
        """{split: (source file, target file)}."""
        return {split: (self.raw_dir / f"{split}.{self.src}", self.raw_dir / f"{split}.{self.tgt}") for split in SPLITS}


def quickstart_steps(args, work, size, patience, corpus, rows):
    """The quickstart's steps: the toy corpus, the dataset, (on a user's corpus) the timing and the plan, each
    model trained, translating the test set and scored, then the attention analysis. A run executes each step
    before the next is made: a user's corpus gets its cap (size["max_update"]) from the BPE-segmented corpus.

    Args: args: the command line; work: the work folder; size: the run's sizes (run_size), bpe_merges set;
    patience: the patience of the models (0: none); corpus: the Corpus; rows: the list the score steps append
    their result rows to.
    Yields: Steps.
    """
    own_corpus, sized, cpu = args.data is not None, args.data is not None and not args.tiny, use_cpu()
    started, projected = time.monotonic(), False
    if not own_corpus:
        yield toy_corpus_step(corpus, size)
    dataset, text_dir, data_bin = dataset_steps(
        corpus.raw_dir, corpus.src, corpus.tgt, work, size["bpe_merges"], tokenize=own_corpus, clean=None
    )
    yield from dataset

    # The cap, the plan and the projection read the BPE-segmented corpus once, after it is made.
    @functools.cache
    def training_tokens():
        return count_training_tokens(work / "bpe", corpus.src, corpus.tgt)

    if sized:
        if "max_update" not in size:
            size["max_update"] = own_corpus_max_update(training_tokens())
        size["warmup"] = min(size["warmup"], size["max_update"] // 4)
    settings, rates = train_settings(args, size, patience), {}
    if sized:
        yield from timing_steps(data_bin, work, settings, args.models, args.threads, cpu, rates)
        yield plan_step(args, size, patience, corpus, rates, training_tokens)

    @functools.cache
    def references():
        tok, raw = read_lines(text_dir / f"test.{corpus.tgt}"), read_lines(corpus.files()["test"][1])
        return References(tok, raw, corpus.tgt, tokenized_bleu=own_corpus)

    # Training, one model per normalizer, all with the same size and budget, then translation of
    # the test set and scoring: a user's corpus with the best checkpoint, the toy pair with the last.
    decoding, select = Decoding(max_len=(1.5, 10)), "best" if own_corpus else "last"
    for i, normalizer in enumerate(args.models, 1):
        model = Model(normalizer, 1, label=f"{normalizer} [{i}/{len(args.models)}]", threads=args.threads)
        model_started = time.monotonic()
        yield from model_steps(data_bin, work, model, settings, references, rows, decoding, (select,), cpu=cpu)
        if normalizer in rates and rows and rows[-1]["updates"]:
            row = rows[-1]
            log(
                f"{model.shown}: {row['updates']} updates in {format_seconds(row['train_seconds'])}, "
                f"{row['train_seconds'] / row['updates']:.2f} s per update with validation and checkpoints "
                f"(timed first updates: {rates[normalizer]:.2f})"
            )
            remaining = [name for name in args.models[i:] if name in rates]
            if remaining and not projected:
                projected = True
                updates = planned_updates(size, training_tokens(), patience)
                log(projection_line(rates, row, remaining, updates, started, model_started))
    yield model_analysis_step(args, work, data_bin, rows, select)


def projection_line(rates, row, remaining, updates, started, model_started):
    """The line that projects the run's total once its first model is trained and evaluated (projected_seconds,
    each model left training `updates`), with what the projection rests on.
    """
    now = time.monotonic()
    evaluation = max(0.0, now - model_started - row["train_seconds"])
    done = (row["model"], row["updates"], row["train_seconds"], evaluation)
    total = projected_seconds(now - started, done, rates, remaining, updates)
    return (
        f"projected total: about {format_seconds(total)}, {format_seconds(now - started)} of it done; the "
        f"{len(remaining)} model(s) left each near {updates} updates at {row['model']}'s measured cost "
        f"(training with validation and checkpoints, {format_seconds(evaluation)} to translate and score the test "
        "set), scaled by their timed rates; the analysis comes on top"
    )


def toy_corpus_step(corpus, size):
    """The step that writes the toy pair once (toy_language.write_toy_corpus)."""
    marker, n_eval = corpus.raw_dir / "corpus.done", size["n_eval"]

    def write():
        log(f"writing the toy corpus to {corpus.raw_dir}")
        write_toy_corpus(corpus.raw_dir, n_train=size["n_train"], n_valid=n_eval, n_test=n_eval)
        mark_done(marker)

    line = (
        f"# corpus: the toy pair, {size['n_train']} training and {n_eval} valid and test sentences -> "
        f"{corpus.raw_dir} (toy_language.write_toy_corpus)"
    )
    return call_step(line, write, skip=lambda: is_done(marker))


def plan_step(args, size, patience, corpus, rates, training_tokens):
    """The step that prints the plan and the estimate from the timed rates (own_corpus_plan); training_tokens()
    gives what a pass over the training data costs.
    """

    def show_plan():
        tokens, threads = training_tokens(), training_threads(args.threads)
        for line in own_corpus_plan(size, corpus.counts, tokens, rates, bool(args.max_update), patience, threads):
            log(line)

    # Skipped when every model is trained: nothing is left to estimate.
    line = "# plan: sizes and the estimate at the timed rates (quickstart.own_corpus_plan)"
    return call_step(line, show_plan, skip=lambda: not rates)


def model_analysis_step(args, work, data_bin, rows, select):
    """The step of the attention analysis of every model: density and learned alphas for the table, figures on
    disk (fairseq-entmax-analyze).
    """
    checkpoints = {name: work / "models" / f"{name}-seed1" / f"checkpoint_{select}.pt" for name in args.models}

    def add_to_rows(analysis):
        for row in rows:
            row.update((analysis or {}).get(row["model"], {}))

    out_dir = work / "analysis"
    return analysis_step(
        data_bin, checkpoints, "test", out_dir, work / "analysis.log", add_to_rows, threads=args.threads
    )


def write_results(args, work, rows, corpus, max_update, patience):
    """Print the table and write it to the work dir (results.md, results.json).

    Args: args: the command line; work: the work folder; rows: the result rows, analysis included; corpus: the
    Corpus; max_update: the update cap the models trained with; patience: the patience they trained with.
    """
    own_corpus = args.data is not None
    counts = corpus.counts or check_parallel_corpus(corpus.files())  # the toy pair's is counted once written
    raw_dir, src, tgt = corpus.raw_dir, corpus.src, corpus.tgt
    table = format_table(rows, bleu_tok=own_corpus, training=own_corpus)
    signatures = f"BLEU: {rows[0]['bleu_signature']}\nchrF: {rows[0]['chrf_signature']}"
    notes = (
        f"Test set: {counts['test']} sentences of {raw_dir} ({src}->{tgt}); density = mean fraction of "
        "keys with nonzero weight; alpha = per-head alpha (1 softmax, 1.5 entmax15, learned for alpha_entmax)."
    )
    if own_corpus:
        # How the models stopped goes right under the table: it says how far the comparison goes.
        table += "\n\n" + convergence_note(rows, max_update, patience)
        notes += (
            " updates: trained in all (in brackets the update of the best validation accuracy, the "
            "checkpoint evaluated); stopped by: the patience or the update cap."
        )
    (work / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (work / "results.md").write_text(f"{table}\n\n{signatures}\n\n{notes}\n")
    print()
    print(table)
    print()
    print(signatures)
    print(notes)


if __name__ == "__main__":
    sys.exit(main())
