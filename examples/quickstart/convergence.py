"""How long the quickstart's models take to converge on a corpus, by the corpus's size: what
sizes its cap on updates and its time estimate (docs/recipes.md, "Your own corpus").

For each size N, the first N training pairs of --data (its valid and test sets whole) go
through the quickstart with a cap out of reach (--max-update), so that the patience stops
every model. Each model's validation curve (its train.log, one validation per epoch) then
says when it stopped, when it was best, and where a patience on the validation loss instead
of the accuracy would have stopped it; its training time over its updates gives the rate the
estimate needs. Runs go to --work-dir/N-pairs/; a second run reuses what the first finished
(the quickstart skips finished stages and resumes an interrupted training).

    python -m examples.quickstart.convergence --data DIR --src de --tgt en \\
        --sizes 5000 10000 19689 --models softmax alpha_entmax --threads 1

Prints one row per corpus size and model, with the rows of earlier runs in the same --work-dir
for other sizes or models, and writes them all to --work-dir/convergence.json. --dry-run prints
the steps (each size's subset, quickstart command and rows) and runs nothing.
"""

import argparse
import json
import sys
from pathlib import Path

from examples.quickstart.quickstart import NORMALIZERS, OWN_CORPUS, PATIENCE, SIZES, count_training_tokens
from fairseq_entmax.pipeline.corpus import SPLITS, check_parallel_corpus, write_first_lines
from fairseq_entmax.pipeline.runner import call_step, command_step, dry_run, run_steps
from fairseq_entmax.pipeline.tables import format_seconds
from fairseq_entmax.pipeline.tools import PipelineError, log, recording_commands, run_logged, run_reporting_errors

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MAX_UPDATE = 20000


def patience_stop(values, patience, maximize):
    """Where a patience on a validation metric stops a run, validated once per epoch.

    Args: values: the metric after each validation, in order; patience: validations without a new best that
    stop the run (fairseq's --patience); maximize: whether higher is better (accuracy) or lower (loss).
    Returns: (stop, best): indexes into values of the validation after which the run stops (None when the
    patience is never met) and of the best one before it (the first to reach it).
    """
    best = 0
    for i, value in enumerate(values):
        if (value > values[best]) if maximize else (value < values[best]):
            best = i
        if i - best >= patience:
            return i, best
    return None, best


def model_row(save_dir, patience):
    """What one model's training log says of its convergence.

    Args: save_dir: the model's folder (train.log, train_seconds.txt); patience: the patience it trained with.
    Returns: A dict: updates and epochs trained, whether the patience stopped it, the update and epoch of its
    best validation accuracy, where a patience on the validation loss would have stopped it and the accuracy
    at that loss's best, the first update within one point of the best accuracy, and the training seconds per
    update.
    """
    from fairseq_entmax.analysis.training_log import read_validation_curve

    curve = read_validation_curve(save_dir / "train.log")
    updates, accuracy, loss = curve["num_updates"], curve["accuracy"], curve["loss"]
    stop, best = patience_stop(accuracy, patience, maximize=True)
    loss_stop, loss_best = patience_stop(loss, patience, maximize=False)
    near = next(i for i, value in enumerate(accuracy) if value >= accuracy[best] - 1.0)
    seconds = float((save_dir / "train_seconds.txt").read_text())
    return {
        "updates": updates[-1],
        "epochs": len(updates),
        "updates_per_epoch": updates[0],
        "stopped_by_patience": stop is not None,
        "best_update": updates[best],
        "best_epoch": best + 1,
        "best_accuracy": accuracy[best],
        "loss_stop_update": None if loss_stop is None else updates[loss_stop],
        "loss_best_update": updates[loss_best],
        "accuracy_at_loss_best": accuracy[loss_best],
        "within_1_point_update": updates[near],
        "train_seconds": seconds,
        "seconds_per_update": seconds / updates[-1],
    }


def convergence_steps(args, files, rows):
    """For each size: its subset written, the quickstart run on it, and its rows read from the models' validation
    curves.

    Args: args: the command line; files: {split: (source file, target file)} of the corpus; rows: the list the
    row steps append to, one row per size and model (convergence.json's).
    Returns: The Steps, a list.
    """
    steps = []
    for n_pairs in args.sizes:
        folder = args.work_dir / f"{n_pairs}-pairs"
        data, work = folder / "data", folder / "quickstart"
        command = [
            sys.executable, "-m", "examples.quickstart.quickstart",
            "--data", data, "--src", args.src, "--tgt", args.tgt, "--work-dir", work,
            "--models", *args.models, "--max-update", args.max_update, "--patience", args.patience,
            *(["--threads", args.threads] if args.threads else []), *(["--tiny"] if args.tiny else []),
        ]  # fmt: skip
        command = [str(part) for part in command]

        def quickstart(n_pairs=n_pairs, command=command, folder=folder):
            log(f"{n_pairs} pairs: the quickstart in {folder / 'quickstart'}")
            run_logged(command, folder / "quickstart.log", show=lambda line: line.rstrip(), cwd=REPO)

        steps += [
            call_step(
                f"# subset: the first {n_pairs} training pairs of {args.data}, valid and test whole -> {data} "
                "(corpus.write_first_lines)",
                lambda n_pairs=n_pairs, data=data: write_first_lines(files, {"train": n_pairs}, data),
            ),
            command_step(command, quickstart),
            call_step(
                f"# rows: each model's validation curve in {work / 'models'} (convergence.size_rows)",
                lambda n_pairs=n_pairs, work=work: rows.extend(size_rows(args, n_pairs, work)),
            ),
        ]
    return steps


def size_rows(args, n_pairs, work):
    """One row per model of a size's quickstart run.

    Returns: The rows, as written to convergence.json.
    """
    batch_tokens = count_training_tokens(work / "bpe", args.src, args.tgt)
    max_tokens = (SIZES["tiny"] if args.tiny else OWN_CORPUS)["max_tokens"]
    results = {row["model"]: row for row in json.loads((work / "results.json").read_text())}
    rows = []
    for model in args.models:
        row = {"pairs": n_pairs, "batch_tokens_per_pass": batch_tokens, "model": model}
        row.update(model_row(work / "models" / f"{model}-seed1", args.patience))
        # Passes over the training data, as the quickstart sizes its cap in them.
        row["passes_at_stop"] = row["updates"] * max_tokens / batch_tokens
        row["passes_at_best"] = row["best_update"] * max_tokens / batch_tokens
        row["bleu"] = results[model]["bleu"]
        rows.append(row)
    return rows


def format_rows(rows):
    """The rows as a Markdown table."""
    lines = [
        "| pairs | batch tokens per pass | model | stopped at update (epoch) | passes | best accuracy at update "
        "(epoch) | passes | within 1 point at update | loss patience stops at | accuracy at loss best | s/update "
        "| training | BLEU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stopped = f"{r['updates']} ({r['epochs']})" + ("" if r["stopped_by_patience"] else ", cap")
        loss_stop = "-" if r["loss_stop_update"] is None else str(r["loss_stop_update"])
        lines.append(
            f"| {r['pairs']} | {r['batch_tokens_per_pass']} | {r['model']} | {stopped} | {r['passes_at_stop']:.1f} | "
            f"{r['best_update']} ({r['best_epoch']}): {r['best_accuracy']:.2f} | {r['passes_at_best']:.1f} | "
            f"{r['within_1_point_update']} | "
            f"{loss_stop} | {r['accuracy_at_loss_best']:.2f} | {r['seconds_per_update']:.3f} | "
            f"{format_seconds(r['train_seconds'])} | {r['bleu']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv=None):
    """The command line (see the top); argparse exits with status 2 on a bad one."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="the corpus: {train,valid,test}.{SRC,TGT}, raw text")
    parser.add_argument("--src", required=True, help="source language code (file suffix)")
    parser.add_argument("--tgt", required=True, help="target language code (file suffix)")
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="training pairs of each run")
    parser.add_argument("--models", nargs="+", default=list(NORMALIZERS), choices=NORMALIZERS, help="default: all four")
    parser.add_argument(
        "--max-update",
        type=int,
        default=DEFAULT_MAX_UPDATE,
        help=f"the cap, to stay out of reach (default {DEFAULT_MAX_UPDATE})",
    )
    parser.add_argument("--patience", type=int, default=PATIENCE, help=f"the quickstart's (default {PATIENCE})")
    parser.add_argument("--threads", type=int, help="CPU threads of each fairseq command (default: torch's choice)")
    parser.add_argument(
        "--work-dir", type=Path, default=REPO / "runs" / "convergence", help="default: runs/convergence"
    )
    parser.add_argument("--tiny", action="store_true", help="the quickstart's --tiny model sizes, for tests")
    parser.add_argument("--dry-run", action="store_true", help="print every step, one per line, and run nothing")
    args = parser.parse_args(argv)
    if args.patience < 1:
        parser.error("--patience must be at least 1: the measurement is of where it stops")
    if min(args.sizes) < 1:
        parser.error("--sizes are numbers of training pairs, 1 or more")
    return args


def run(args):
    """Check the corpus, then measure (or, with --dry-run, print the steps), print and write the table. What ran
    is appended to --work-dir/commands.log.
    """
    files = {split: (args.data / f"{split}.{args.src}", args.data / f"{split}.{args.tgt}") for split in SPLITS}
    available = check_parallel_corpus(files)["train"]
    if max(args.sizes) > available:
        raise PipelineError(f"--sizes {max(args.sizes)}: {args.data} has {available} training pairs")
    args.work_dir, rows = args.work_dir.resolve(), []
    if args.dry_run:
        dry_run(convergence_steps(args, files, rows), f"# convergence of the quickstart; work dir {args.work_dir}")
        return
    with recording_commands(args.work_dir / "commands.log"):
        run_steps(convergence_steps(args, files, rows))
    # Rows of earlier runs for other sizes or models stay: one table for every measurement.
    record = args.work_dir / "convergence.json"
    measured = {(row["pairs"], row["model"]) for row in rows}
    earlier = json.loads(record.read_text()) if record.exists() else []
    rows = sorted(
        [row for row in earlier if (row["pairs"], row["model"]) not in measured] + rows,
        key=lambda row: (row["pairs"], NORMALIZERS.index(row["model"])),
    )
    record.write_text(json.dumps(rows, indent=1) + "\n")
    print(format_rows(rows))


def main(argv=None):
    """The command line, as `python -m examples.quickstart.convergence` runs it.

    Returns: The exit status: 0, or 2 with a message when an input or a stage fails.
    """
    return run_reporting_errors(run, parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
