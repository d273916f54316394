"""Recipes for the translation experiments of Correia et al. (2019), Table 1, with fairseq:
softmax, 1.5-entmax and learned alpha-entmax attention (top-k, k = 8, on request) in
Transformer base, with the settings of the paper and the authors' code (tasks.py has the table,
each value with its source; docs/recipes.md shows it); and the IWSLT14 de-en experiment of Zhao
et al.'s Explicit Sparse Transformer (`iwslt14`): softmax and top-k (k = 8) attention in
transformer_iwslt_de_en with the settings of the authors' script, selected among averages of
epoch checkpoints on the validation set.

    .venv/bin/python -m examples.translation.recipe iwslt17 --dry-run   # every command, nothing run
    .venv/bin/python -m examples.translation.recipe iwslt17              # IWSLT17 de-en on the GPUs it sees
    .venv/bin/python -m examples.translation.recipe kftt --raw-dir DIR   # KFTT ja-en from your files
    .venv/bin/python -m examples.translation.recipe wmt16 --smoke        # tiny end-to-end check on a CPU
    .venv/bin/python -m examples.translation.recipe wmt14 --models alpha_entmax --seed 2
    .venv/bin/python -m examples.translation.recipe iwslt14              # seeds 1 2 3, softmax and top-k
    .venv/bin/python -m examples.translation.recipe wmt14 --data-only    # the data-bin alone, no GPU needed

Stages (each skipped when finished; training resumes from checkpoint_last.pt):
  prepare   official data -> plain text train/valid/test.{src,tgt} (download, or --raw-dir DIR
            holding those six files, or in --smoke mode real text from ../shared/data)
  tokenize  Moses tokenisation with sacremoses (not KFTT: its official text is tokenised)
  bpe       joint BPE, 32k merges (subword-nmt); training pairs cleaned as clean-corpus-n.perl
  binarize  fairseq-preprocess, one joined dictionary (iwslt14: one per language, as the authors)
  train     fairseq-train per normalizer: 8192 tokens per update on any number of GPUs,
            validation accuracy every 5k or 10k updates, stop after 3 without improvement
  evaluate  fairseq-generate (beam 5, no length normalisation) with the best checkpoint;
            tokenized BLEU as in the paper, sacreBLEU and chrF; --average-last N adds the
            average of the last N checkpoints, reported apart
            (iwslt14: 90 epochs; averages of the last 10 epoch checkpoints ending at epochs
            50, 55, ..., 90 translate the validation set, the best translates the test set:
            fairseq's BLEU on the lowercased tokenised text, sacreBLEU and chrF)
  analyze   fairseq-entmax-analyze on the validation set: density, learned alphas, figures
"""

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

from examples.translation.tasks import SMOKE_BPE_MERGES, TASKS, batch_shape, experiment_of, tokenized_bleu_note
from fairseq_entmax.names import NORMALIZER_NAMES
from fairseq_entmax.pipeline.attention_analysis import analysis_step
from fairseq_entmax.pipeline.corpus import SPLITS, check_parallel_corpus, read_lines
from fairseq_entmax.pipeline.dataset import dataset_steps
from fairseq_entmax.pipeline.download import download
from fairseq_entmax.pipeline.evaluation import Model
from fairseq_entmax.pipeline.markers import done_with, mark_done
from fairseq_entmax.pipeline.runner import call_step, dry_run, run_steps
from fairseq_entmax.pipeline.seeds import paired_differences_section
from fairseq_entmax.pipeline.tables import format_seconds
from fairseq_entmax.pipeline.tools import PipelineError, log, recording_commands, run_reporting_errors

REPO = Path(__file__).resolve().parents[2]
DEFAULT_SHARED_DATA = REPO.parent / "shared" / "data"


def _parser():
    """The recipe's argparse parser: its options and their help."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS), help="the paper's task")
    parser.add_argument("--src", help="source language (default: the paper's direction)")
    parser.add_argument("--tgt", help="target language")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="every stage at tiny scale on real text from ../shared/data (minutes on a CPU)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print every command the recipe would run, one per line, and run nothing"
    )
    parser.add_argument(
        "--num-gpus",
        type=int,
        help="with --dry-run: the GPUs to plan for (default 1); a real run uses the GPUs it sees",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run the full recipe on a CPU although no GPU is there (weeks for Transformer base)",
    )
    parser.add_argument("--fp16", action="store_true", help="train in half precision (fairseq --fp16; GPU only)")
    parser.add_argument(
        "--raw-dir",
        type=Path,
        help="read plain text {train,valid,test}.{src,tgt} from here instead of downloading the official data",
    )
    parser.add_argument(
        "--shared-data",
        type=Path,
        default=DEFAULT_SHARED_DATA,
        help="the project's shared data folder, for --smoke (default: %(default)s)",
    )
    parser.add_argument(
        "--work-dir", type=Path, help="where everything goes (default: runs/<task>-<src>-<tgt>[-smoke])"
    )
    _add_training_options(parser)
    return parser


def _add_training_options(parser):
    """The recipe's options of what it trains and evaluates."""
    parser.add_argument(
        "--models",
        nargs="+",
        choices=NORMALIZER_NAMES,
        help="normalizers (default: the paper's: softmax entmax15 alpha_entmax, Table 1 of Correia et al.; "
        "softmax topk for iwslt14)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        nargs="+",
        help="training seeds, one model per normalizer and seed (default: 1; 1 2 3 for iwslt14, as its authors)",
    )
    parser.add_argument("--max-update", type=int, help="cap on the training updates (default: per task)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        help="tokens per batch per GPU (default: 8192 / GPUs; iwslt14: 4000 where GPUs allow, else 16000 / GPUs); "
        "--max-tokens x --update-freq x GPUs must make the paper's 8192 (iwslt14: 16000) tokens per update",
    )
    parser.add_argument(
        "--update-freq",
        type=int,
        help="accumulate gradients over N batches (default: what makes the paper's tokens per update)",
    )
    parser.add_argument(
        "--average-last",
        type=int,
        default=0,
        metavar="N",
        help="also evaluate the average of the last N checkpoints, reported apart (default: no)",
    )
    parser.add_argument("--workers", type=int, default=1, help="processes for tokenisation, BPE and binarisation")
    parser.add_argument(
        "--analysis-sentences",
        type=int,
        help="validation sentences the attention analysis runs over (default: all; 100 with --smoke)",
    )
    parser.add_argument("--skip-analysis", action="store_true", help="no fairseq-entmax-analyze stage")
    parser.add_argument(
        "--data-only",
        action="store_true",
        help="prepare, tokenize, bpe and binarize, then stop: the data-bin to train from, made without a GPU",
    )


def parse_args(argv=None):
    """The recipe's command line.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: An argparse.Namespace with src and tgt filled in (the paper's direction by default); argparse
    exits with status 2 on a bad command line.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    if bool(args.src) != bool(args.tgt):
        parser.error("give both --src and --tgt, or neither (the paper's direction)")
    pair = (args.src, args.tgt) if args.src else task.pairs[0]
    if pair not in task.pairs:
        supported = ", ".join(f"--src {s} --tgt {t}" for s, t in task.pairs)
        parser.error(f"unknown language pair {pair[0]}-{pair[1]} for {task.title}: use {supported}")
    if args.smoke and args.raw_dir:
        parser.error("--smoke reads ../shared/data; --raw-dir is for full runs: give one of them")
    if args.num_gpus is not None and not args.dry_run:
        parser.error("--num-gpus plans a --dry-run; a real run uses the GPUs it sees (CUDA_VISIBLE_DEVICES)")
    if args.average_last == 1 or args.average_last < 0:
        parser.error("--average-last N needs N >= 2 checkpoints")
    experiment = experiment_of(task)
    if args.average_last and not experiment.selection.allows_average_last:
        parser.error(f"--average-last is for the best-checkpoint tasks: {task.name} averages epoch checkpoints already")
    args.models = args.models or list(experiment.normalizers)
    args.seed = args.seed or list(experiment.seeds)
    if len(set(args.seed)) != len(args.seed):
        parser.error("--seed: each seed once")
    args.src, args.tgt = pair
    return args


def main(argv=None):
    """The recipe, as `python -m examples.translation.recipe` runs it.

    Args: argv: the arguments (default: sys.argv[1:]).
    Returns: The exit status: 0, or 2 (1 for a failing tool) with a message.
    """
    return run_reporting_errors(run, parse_args(argv))


def devices(args):
    """Where to train. The full recipe trains Transformer base for 100k+ updates: on a CPU that is weeks, so
    without CUDA it stops before any download unless --cpu insists. --smoke is made for the CPU, and
    --data-only trains nothing.

    Args: args: the command line.
    Returns: (number of GPUs to train on, whether to train on the CPU).
    Raises PipelineError: no CUDA device, for a full run without --cpu.
    """
    import torch

    # --num-gpus (a dry run's option) plans for that many; otherwise the dry run plans what the
    # run would do on this machine.
    gpus = args.num_gpus or torch.cuda.device_count()
    if args.smoke or args.data_only:
        return max(gpus, 1), gpus == 0
    if gpus == 0 and not args.cpu:
        if args.dry_run:
            # Here the run itself would stop: show the commands of the machine it is made for.
            return 1, False
        raise PipelineError(
            f"no CUDA device found: the full recipe {experiment_of(TASKS[args.task]).training_note}, weeks "
            "on a CPU. Run it on a machine with a GPU, use --smoke for a CPU-sized check of every stage, "
            "--dry-run to see the commands, or --cpu to train on this CPU anyway."
        )
    return max(gpus, 1), gpus == 0


def experiment_settings(args, num_gpus, cpu=False):
    """The TrainSettings of this run: the task's table (or the smoke mode's), batch shaped for the paper's tokens
    per update (8192; iwslt14 16000) on num_gpus devices, with the command line's overrides.

    Args: args: the command line; num_gpus: the devices to train on; cpu: whether it trains on the CPU.
    Returns: A TrainSettings.
    Raises PipelineError: --max-tokens and --update-freq cannot make the paper's tokens per update.
    """
    experiment = experiment_of(TASKS[args.task])
    if args.smoke:
        settings = experiment.smoke_settings
        for option in ("max_update", "max_tokens", "update_freq"):
            if getattr(args, option):
                settings = dataclasses.replace(settings, **{option: getattr(args, option)})
    else:
        max_tokens, update_freq = batch_shape(
            num_gpus,
            args.max_tokens,
            args.update_freq,
            total=experiment.tokens_per_update,
            preferred_max_tokens=experiment.preferred_max_tokens,
        )
        settings = experiment.train_settings(args.task, max_tokens, update_freq, cpu=cpu)
        if args.max_update:
            settings = dataclasses.replace(settings, max_update=args.max_update)
    extra = ["--fp16"] if args.fp16 and "--fp16" not in settings.extra_args else []
    if num_gpus > 1:
        # fairseq would take every visible GPU; naming the count keeps the tokens per update.
        extra += ["--distributed-world-size", num_gpus]
    return dataclasses.replace(settings, extra_args=[*settings.extra_args, *extra]) if extra else settings


class Layout:
    """Where a run's files go, shared by the run and the dry run."""

    def __init__(self, args):
        task = TASKS[args.task]
        self.task, self.src, self.tgt = task, args.src, args.tgt
        self.work = (
            args.work_dir or REPO / "runs" / f"{task.name}-{args.src}-{args.tgt}{'-smoke' if args.smoke else ''}"
        ).resolve()
        self.raw = args.raw_dir if args.raw_dir else self.work / "raw"
        # The official KFTT text is tokenised, the smoke mode's KFTT text is not; the IWSLT14
        # text is tokenised by its prepare stage in both modes.
        self.tokenize = not (task.pretokenized and (not args.smoke or task.smoke.pretokenized))
        self.text = self.work / "tok" if self.tokenize else Path(self.raw)
        self.bpe = self.work / "bpe"
        self.data_bin = self.work / "data-bin"
        # sacreBLEU scores against the untokenised test set.
        orig = Path(self.raw) / f"test.orig.{args.tgt}"
        self.references_raw = orig if not self.tokenize else Path(self.raw) / f"test.{args.tgt}"
        self.analysis = self.work / f"analysis-seed{args.seed[0]}"
        self.seeds = "-".join(str(seed) for seed in args.seed)

    def save_dir(self, normalizer, seed):
        """Where one model's checkpoints and log go.

        Args: normalizer: the normalizer; seed: the training seed.
        Returns: The folder of that model's checkpoints and log.
        """
        return self.work / "models" / f"{normalizer}-seed{seed}"


class Plan:
    """One run of the recipe, shared by its steps: the command line, where the files go, the training settings
    and decoding, and the result rows the run's steps add.
    """

    def __init__(self, args, settings, num_gpus, cpu):
        self.task = TASKS[args.task]
        self.experiment = experiment_of(self.task)
        self.layout = Layout(args)
        self.src, self.tgt, self.smoke, self.seeds = args.src, args.tgt, args.smoke, args.seed
        self.average_last = args.average_last
        self.num_gpus, self.cpu = num_gpus, cpu
        self.selection = self.experiment.selection
        self.settings = self.selection.settings(settings, self)
        # A model of the smoke mode has barely trained: its translations are capped in length.
        max_len = (1.2, 10) if args.smoke else None
        self.decoding = dataclasses.replace(self.experiment.decoding, max_len=max_len)
        self.tokenized_bleu_note = tokenized_bleu_note(self.task.name, self.layout.tokenize)
        self.rows, self.counts, self._references = [], None, None

    def references(self):
        """The test references, read once the dataset is built.

        Returns: (tokenised as the training data, as the corpus has them): lists of lines.
        """
        if self._references is None:
            self._references = (
                read_lines(self.layout.text / f"test.{self.tgt}"),
                read_lines(self.layout.references_raw),
            )
        return self._references


def prepare_steps(args, plan):
    """The prepare stage: official data (or --raw-dir, or the smoke mode's text) -> plain, line-aligned text,
    checked before anything long starts.

    Args: args: the command line; plan: the Plan.
    Yields: Steps; the last one prepares the corpus (skipped when prepared from the same data), checks it and
    counts it (plan.counts).
    """
    task, layout = plan.task, plan.layout
    marker = layout.raw / "prepare.done"
    # A corpus prepared from other data is refused, not reused.
    prepared_from = (
        {"smoke": str(Path(args.shared_data).resolve()), "pair": [plan.src, plan.tgt]}
        if args.smoke
        else {"downloads": task.name, "pair": [plan.src, plan.tgt]}
    )

    def prepared():
        return done_with(marker, prepared_from, "the prepared corpus")

    def prepare():
        # --raw-dir's text is used as it is.
        if not args.raw_dir and not prepared():
            log(f"prepare: {task.smoke.note}" if args.smoke else "prepare: extracting plain text")
            layout.raw.mkdir(parents=True, exist_ok=True)
            if args.smoke:
                task.smoke.write(task, args.shared_data, plan.src, plan.tgt, layout.raw)
            else:
                task.prepare(layout.work / "downloads", layout.raw, plan.src, plan.tgt)
            _check_corpus(plan)
            mark_done(marker, settings=prepared_from)
        plan.counts = _check_corpus(plan)
        log("corpus: " + ", ".join(f"{s} {n} pairs" for s, n in plan.counts.items()))

    if args.smoke:
        yield call_step(f"# prepare: {task.smoke.note} -> {layout.raw} (corpora.{task.smoke.write.__name__})", prepare)
    elif args.raw_dir:
        yield call_step(f"# prepare: plain text from {args.raw_dir}", prepare)
    else:
        for url, name in task.downloads:
            path = layout.work / "downloads" / name
            instead = f"offline? Copy that file to {path} yourself, or give --raw-dir DIR (plain text train/valid/test)"
            yield call_step(
                f"# prepare: download {url} -> {path} (pipeline.download)",
                lambda url=url, path=path, instead=instead: download(url, path, instead),
                skip=prepared,
            )
        yield call_step(
            f"# prepare: extract line-aligned text into {layout.raw} (corpora.{task.prepare.__name__})", prepare
        )


def _check_corpus(plan):
    """The prepared corpus's {split: pairs}.

    Raises PipelineError: the corpus is not line-aligned, or the untokenised test references of a tokenised
    corpus are missing.
    """
    raw, src, tgt = plan.layout.raw, plan.src, plan.tgt
    counts = check_parallel_corpus({s: (raw / f"{s}.{src}", raw / f"{s}.{tgt}") for s in SPLITS})
    if not Path(plan.layout.references_raw).is_file():
        # A tokenised corpus (KFTT's, IWSLT14's) comes with its untokenised test references.
        raise PipelineError(
            f"{plan.layout.references_raw} not found: {plan.task.name}'s text is tokenised, and sacreBLEU needs the "
            f"untokenised test references beside it (test.orig.{src}, test.orig.{tgt})"
        )
    return counts


def dataset_steps_of(args, plan):
    """The tokenize, bpe and binarize stages (dataset.dataset_steps).

    Args: args: the command line; plan: the Plan.
    Returns: The Steps, a list.
    """
    layout, experiment = plan.layout, plan.experiment
    steps, _, _ = dataset_steps(
        layout.raw,
        plan.src,
        plan.tgt,
        layout.work,
        SMOKE_BPE_MERGES if args.smoke else experiment.bpe_merges,
        tokenize=layout.tokenize,
        clean=(experiment.clean[0], plan.task.clean_max_ratio) if experiment.clean else None,
        workers=args.workers,
        joined_dictionary=experiment.joined_dictionary,
    )
    return steps


def seed_analysis_step(args, plan):
    """The analyze stage: fairseq-entmax-analyze on the validation set, as the paper, over the first seed's
    models.

    Args: args: the command line; plan: the Plan.
    Returns: A Step; its action adds the analysis to the first seed's reported rows.
    """
    layout = plan.layout
    checkpoints = {
        normalizer: plan.selection.analyzed_checkpoint(layout.save_dir(normalizer, args.seed[0]))
        for normalizer in args.models
    }
    sentences = args.analysis_sentences or (100 if args.smoke else None)

    def add_to_rows(analysis):
        for row in plan.rows:
            if row["seed"] == args.seed[0] and row["selection"] == plan.selection.reported:
                row.update((analysis or {}).get(row["model"], {}))

    log_path = layout.work / f"analysis-seed{args.seed[0]}.log"
    return analysis_step(layout.data_bin, checkpoints, "valid", layout.analysis, log_path, add_to_rows, sentences)


def walk(args, plan):
    """Every step of the recipe, in order: what the dry run prints and the run executes.

    Args: args: the command line; plan: the Plan.
    Yields: Steps.
    """
    yield from prepare_steps(args, plan)
    yield from dataset_steps_of(args, plan)
    if args.data_only:
        return
    models = [(seed, normalizer) for seed in args.seed for normalizer in args.models]
    for i, (seed, normalizer) in enumerate(models, 1):
        label = f"{normalizer}{f' seed {seed}' if len(args.seed) > 1 else ''} [{i}/{len(models)}]"
        yield from plan.selection.model_steps(plan, Model(normalizer, seed, label))
    if not args.skip_analysis:
        yield seed_analysis_step(args, plan)


def run(args):
    """Every stage (or, with --dry-run, their lines), then the table, printed and written to the work dir. What
    ran is appended to the work dir's commands.log.

    Args: args: the command line, as parse_args returns it.
    """
    num_gpus, cpu = devices(args)
    plan = Plan(args, experiment_settings(args, num_gpus, cpu=cpu), num_gpus, cpu)
    task, settings = plan.task, plan.settings
    tokens = settings.max_tokens * settings.update_freq * num_gpus
    header = (
        f"# {task.title}, {args.src}->{args.tgt}{' (smoke mode)' if args.smoke else ''}: "
        + ("CPU" if cpu else f"{num_gpus} GPU(s)")
        + f", {tokens} tokens per update (--max-tokens {settings.max_tokens} x --update-freq "
        f"{settings.update_freq} x {num_gpus} device(s)); work dir {plan.layout.work}"
    )
    if args.dry_run:
        dry_run(walk(args, plan), header)
        return
    started = time.time()
    log(header[2:])
    with recording_commands(plan.layout.work / "commands.log"):
        run_steps(walk(args, plan))
    if args.data_only:
        log(f"data-bin ready: {plan.layout.data_bin}; the same command without --data-only trains from it")
        return
    write_results(args, plan, started)


def write_results(args, plan, started):
    """Print the results' tables and write them to the work dir (results-seed<seeds>.md, .json).

    Args: args: the command line; plan: the Plan, its rows filled by the run; started: when the run started
    (time.time()).
    """
    task, rows, src, tgt = plan.task, plan.rows, args.src, args.tgt
    lines = [
        f"{task.title} {src}->{tgt}{' (smoke mode: ' + task.smoke.note + ')' if args.smoke else ''}",
        f"test: {plan.counts['test']} sentences; data: {task.data_notes if not args.smoke else task.smoke.note}",
        "",
    ]
    tables, bleu_note = plan.selection.report(plan, rows)
    lines += tables
    if len(args.seed) > 1:
        lines += paired_differences_section([row for row in rows if row["selection"] == plan.selection.reported])
    lines += [
        "",
        f"tok BLEU: {rows[0]['bleu_tok_signature']}; {bleu_note}",
        f"BLEU: {rows[0]['bleu_signature']}",
        f"chrF: {rows[0]['chrf_signature']}",
    ]
    if not args.smoke and (src, tgt) == task.pairs[0] and task.paper_bleu:
        lines.append("paper (tokenized BLEU): " + ", ".join(f"{k} {v}" for k, v in task.paper_bleu.items()))
    report = "\n".join(lines)
    results = plan.layout.work / f"results-seed{plan.layout.seeds}"
    results.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    results.with_suffix(".md").write_text(report + "\n")
    print()
    print(report)
    print(f"\nresults: {results.with_suffix('.md')}; total time {format_seconds(time.time() - started)}")


if __name__ == "__main__":
    sys.exit(main())
