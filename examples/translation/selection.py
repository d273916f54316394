"""How a recipe's Experiment selects, translates and scores each model, as steps of the recipe's
walk (Step): BestCheckpoint, Correia et al.'s checkpoint_best.pt (and, on request, an average of
the last checkpoints); EpochAverages, Zhao et al.'s IWSLT14 de-en selection: each model's last 10
epoch checkpoints averaged, ending at several epochs (50, 55, ..., 90), each average translating
the validation set; the average with the best validation BLEU translates the test set. Its BLEU
is fairseq-generate's on the lowercased tokenised text, what the authors' script reads; sacreBLEU
and chrF, case-insensitive, on the detokenised text come besides.
"""

import dataclasses
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from examples.pipeline.checkpoints import average_checkpoints
from examples.pipeline.corpus import read_lines
from examples.pipeline.evaluation import DEFAULT_DECODING, References, generate, generate_command, train_and_evaluate
from examples.pipeline.tables import format_table
from examples.pipeline.tokenization import detokenize_lines
from examples.pipeline.tools import PipelineError, ToolError, log
from examples.pipeline.training import train, train_command

# The selected average, a symbolic link in the model's folder: the test set is translated with it.
SELECTED = "checkpoint_selected.pt"
FAIRSEQ_BLEU_SIGNATURE = "fairseq-generate BLEU4 (--remove-bpe) on the lowercased Moses-tokenised text"
_FAIRSEQ_BLEU = re.compile(r"^Generate \S+ with beam=\d+: BLEU4 = ([\d.]+)")


def average_name(n, end):
    """The file name of an average of epoch checkpoints.

    Args:
        n: how many epochs it averages.
        end: its last epoch.

    Returns:
        checkpoint_avg{n}_ep{end}.pt.
    """
    return f"checkpoint_avg{n}_ep{end}.pt"


def epoch_average(save_dir, n, end, label):
    """The average of checkpoint{end-n+1}.pt ... checkpoint{end}.pt, as fairseq's
    average_checkpoints.py --num-epoch-checkpoints n --checkpoint-upper-bound end makes it
    (made once).

    Args:
        save_dir: the model's --save-dir.
        n: how many epoch checkpoints.
        end: the last epoch.
        label: the model's name in progress lines.

    Returns:
        The averaged checkpoint's path, or None when an epoch checkpoint of the range is missing.
    """
    save_dir = Path(save_dir)
    out = save_dir / average_name(n, end)
    if out.exists():
        return out
    paths = [save_dir / f"checkpoint{epoch}.pt" for epoch in range(end - n + 1, end + 1)]
    if not all(path.exists() for path in paths):
        return None
    log(f"{label}: averaging the checkpoints of epochs {end - n + 1}-{end}")
    # Written under another name first: an interrupted average is not taken for a finished one.
    partial = out.with_suffix(".part")
    average_checkpoints(paths, partial)
    partial.rename(out)
    return out


def fairseq_bleu(out_dir, subset):
    """fairseq-generate's BLEU of a translated subset, from the last line of its output.

    Args:
        out_dir: the --results-path of fairseq-generate.
        subset: the subset translated.

    Returns:
        BLEU4, a float.

    Raises:
        ToolError: the output has no BLEU line.
    """
    path = Path(out_dir) / f"generate-{subset}.txt"
    for line in reversed(read_lines(path)):
        found = _FAIRSEQ_BLEU.match(line)
        if found:
            return float(found.group(1))
    raise ToolError(f"{path} has no BLEU4 line: did fairseq-generate finish?")


def score_lowercased(hypotheses_tok, references_raw, tgt):
    """sacreBLEU's BLEU and chrF of the translations, case-insensitive: the recipe's text is
    lowercased, the references are not.

    Args:
        hypotheses_tok: the translations, tokenised and lowercased (as generate returns them).
        references_raw: the references as the corpus has them.
        tgt: the target language (its Moses detokeniser).

    Returns:
        {"bleu", "chrf", "bleu_signature", "chrf_signature"}.

    Raises:
        ToolError: there are not as many translations as references.
    """
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses_tok) != len(references_raw):
        raise ToolError(f"{len(hypotheses_tok)} translations for {len(references_raw)} references")
    detokenized = detokenize_lines(hypotheses_tok, tgt)
    bleu, chrf = BLEU(lowercase=True), CHRF(lowercase=True)
    return {
        "bleu": round(bleu.corpus_score(detokenized, [references_raw]).score, 2),
        "chrf": round(chrf.corpus_score(detokenized, [references_raw]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def est_bleu_note():
    """How the IWSLT14 recipe's tokenised BLEU is computed, for the results.

    Returns:
        A sentence.
    """
    return FAIRSEQ_BLEU_SIGNATURE + ", as the authors' script reads it"


def _select(save_dir, chosen):
    link = Path(save_dir) / SELECTED
    # A new link under another name, then renamed over the old one: the switch is atomic.
    temporary = link.with_name(SELECTED + ".new")
    temporary.unlink(missing_ok=True)
    os.symlink(chosen.name, temporary)
    temporary.replace(link)
    return link


def train_and_select(data_bin, work, model, settings, average, references_raw, tgt, decoding=DEFAULT_DECODING):
    """Train one normalizer with one seed (skipped when trained), average its epoch checkpoints
    at each end epoch, translate the validation set with each average, and the test set with
    the one of the best validation BLEU (the later epoch on a tie).

    Args:
        data_bin: the data-bin.
        work: the work folder (models/ and eval/ go there).
        model: the Model (evaluation.Model).
        settings: the TrainSettings (epoch checkpoints, keep_last_epochs covering the averages).
        average: (n, end epochs): how many epoch checkpoints each average takes, and their last
            epochs.
        references_raw: the test references as the corpus has them (sacreBLEU).
        tgt: the target language.
        decoding: the Decoding (evaluation.Decoding).

    Returns:
        A result row: model, seed, selection ("average"), end_epoch (the selected average's
        last epoch), valid_bleu ({end epoch: fairseq BLEU}), checkpoint, hypotheses (their
        file), bleu_tok (fairseq's BLEU on the test set) and its signature, the scores of
        score_lowercased and train_seconds.

    Raises:
        PipelineError: no end epoch has all its checkpoints (training stopped too early).
    """
    name, label = model.name, model.shown
    save_dir = Path(work) / "models" / name
    seconds = train(data_bin, save_dir, model.normalizer, settings, seed=model.seed, label=label)
    n, ends = average
    valid_bleu, averages = {}, {}
    for end in ends:
        checkpoint = epoch_average(save_dir, n, end, label)
        if checkpoint is None:
            log(f"{label}: no checkpoints of all epochs {end - n + 1}-{end}: no average ending at epoch {end}")
            continue
        out = Path(work) / "eval" / f"{name}-avg{n}-ep{end}"
        generate(data_bin, checkpoint, "valid", out, decoding, label=label)
        valid_bleu[end], averages[end] = fairseq_bleu(out, "valid"), checkpoint
    if not valid_bleu:
        raise PipelineError(
            f"{label}: {save_dir} has no {n} consecutive epoch checkpoints ending at any of epochs "
            f"{', '.join(map(str, ends))}: did training stop early (--max-update)? Delete the folder and train again."
        )
    chosen = max(valid_bleu, key=lambda end: (valid_bleu[end], end))
    log(
        f"{label}: validation BLEU "
        + ", ".join(f"ep{end} {bleu:.2f}" for end, bleu in valid_bleu.items())
        + f"; selected the average ending at epoch {chosen}"
    )
    selected = _select(save_dir, averages[chosen])
    out = Path(work) / "eval" / f"{name}-selected"
    hypotheses = generate(data_bin, selected, "test", out, decoding, label=label)
    scores = score_lowercased(hypotheses, references_raw, tgt)
    scores["bleu_tok"] = fairseq_bleu(out, "test")
    scores["bleu_tok_signature"] = FAIRSEQ_BLEU_SIGNATURE
    log(f"{label}: test BLEU {scores['bleu_tok']:.2f} (fairseq), sacreBLEU {scores['bleu']:.2f}")
    return {
        "model": model.normalizer,
        "seed": model.seed,
        "selection": "average",
        "end_epoch": chosen,
        "valid_bleu": valid_bleu,
        "checkpoint": str(selected),
        "hypotheses": str(out / "test.hyp"),
        **scores,
        "train_seconds": seconds,
    }


@dataclass(frozen=True)
class Step:
    """One step of a recipe's walk: the dry run prints its line, the run calls its action.

    Attributes:
        line: a shell command, or a comment line naming the function that does the step.
        action: what the run calls, without arguments; None where a later step of the same
            stage does this one too, in one library call (build_dataset, train_and_evaluate).
    """

    line: str
    action: object = None


def command_step(command, action=None):
    """A Step whose line is a command, quoted as a shell would take it.

    Args:
        command: the command, a list of str.
        action: the Step's action.

    Returns:
        A Step.
    """
    return Step(shlex.join(command), action)


def _generate_command(plan, checkpoint, subset, out_dir):
    d = plan.decoding
    return generate_command(plan.layout.data_bin, checkpoint, subset, out_dir, d.beam, d.lenpen, d.max_len, plan.cpu)


def _display_rows(rows, seeds):
    # With several seeds, each row names its seed.
    return [dict(row, model=f"{row['model']} (seed {row['seed']})") if len(seeds) > 1 else row for row in rows]


@dataclass(frozen=True)
class BestCheckpoint:
    """Correia et al.'s selection: checkpoint_best.pt (the best validation accuracy) translates
    the test set; with --average-last N, the average of the last N checkpoints too, reported
    apart."""

    # The selection whose checkpoint the attention analysis reads.
    reported = "best"
    allows_average_last = True

    def settings(self, settings, plan):
        """The TrainSettings, keeping enough checkpoints for --average-last.

        Args:
            settings: the TrainSettings of the task.
            plan: the recipe's Plan.

        Returns:
            A TrainSettings.
        """
        if not plan.average_last:
            return settings
        return dataclasses.replace(settings, keep_last_epochs=max(settings.keep_last_epochs, plan.average_last))

    def analyzed_checkpoint(self, save_dir):
        """The checkpoint of a model that the attention analysis reads.

        Args:
            save_dir: the model's --save-dir.

        Returns:
            Its path.
        """
        return save_dir / "checkpoint_best.pt"

    def model_steps(self, plan, model):
        """Train one model, translate the test set with each selected checkpoint and score it.

        Args:
            plan: the recipe's Plan.
            model: the Model (evaluation.Model).

        Yields:
            Steps; the action of each score step appends a result row to plan.rows.
        """
        layout, work = plan.layout, plan.layout.work
        save_dir = layout.save_dir(model.normalizer, model.seed)
        yield command_step(
            train_command(layout.data_bin, save_dir, model.normalizer, plan.settings, model.seed, plan.cpu)
        )
        for select in ("best",) + (("average",) if plan.average_last else ()):
            if select == "average":
                checkpoint = save_dir / f"checkpoint_avg{plan.average_last}.pt"
                yield Step(
                    f"# average: the parameters of the last {plan.average_last} checkpoints of {save_dir} "
                    f"-> {checkpoint} (checkpoints.average_checkpoints)"
                )
            else:
                checkpoint = self.analyzed_checkpoint(save_dir)
            out = work / "eval" / f"{model.name}-{select}"
            yield command_step(_generate_command(plan, checkpoint, "test", out))

            def evaluate(select=select):
                references = References(*plan.references(), plan.tgt, retokenize=layout.tokenize)
                plan.rows.append(
                    train_and_evaluate(
                        layout.data_bin,
                        work,
                        model,
                        plan.settings,
                        references,
                        plan.decoding,
                        select=select,
                        average_last=plan.average_last,
                    )
                )

            yield Step(
                f"# score: {out / 'test.hyp'} against {layout.references_raw}: tokenized BLEU "
                f"({plan.tokenized_bleu_note}), sacreBLEU and chrF (evaluation.score)",
                evaluate,
            )

    def report(self, plan, rows):
        """The results' tables.

        Args:
            plan: the recipe's Plan.
            rows: the result rows.

        Returns:
            (lines, the note on how tokenized BLEU was computed).
        """
        lines = [
            "Best checkpoint (validation accuracy):",
            "",
            format_table(_display_rows([r for r in rows if r["selection"] == "best"], plan.seeds), bleu_tok=True),
        ]
        averaged = [
            dict(row, model=f"{row['model']} (avg {plan.average_last})")
            for row in _display_rows(rows, plan.seeds)
            if row["selection"] == "average"
        ]
        if averaged:
            lines += ["", f"Average of the last {plan.average_last} checkpoints:", "", format_table(averaged, True)]
        return lines, plan.tokenized_bleu_note


@dataclass(frozen=True)
class EpochAverages:
    """Zhao et al.'s selection: averages of the last n epoch checkpoints ending at several
    epochs translate the validation set, the best of them the test set (train_and_select).

    Attributes:
        average: (n, end epochs) of a full run.
        smoke_average: (n, end epochs) of the smoke mode.
    """

    average: tuple
    smoke_average: tuple

    reported = "average"
    allows_average_last = False

    def averages(self, plan):
        """(n, end epochs) of this run (full or smoke)."""
        return self.smoke_average if plan.smoke else self.average

    def settings(self, settings, plan):
        """The TrainSettings, unchanged: keep_last_epochs covers the averages.

        Args:
            settings: the TrainSettings of the task.
            plan: the recipe's Plan.

        Returns:
            settings.
        """
        return settings

    def analyzed_checkpoint(self, save_dir):
        """The checkpoint of a model that the attention analysis reads.

        Args:
            save_dir: the model's --save-dir.

        Returns:
            Its path: the link to the selected average.
        """
        return save_dir / SELECTED

    def model_steps(self, plan, model):
        """Train one model, translate the validation set with each average, the test set with
        the best, and score it.

        Args:
            plan: the recipe's Plan.
            model: the Model (evaluation.Model).

        Yields:
            Steps; the action of the score step appends the result row to plan.rows.
        """
        layout, work, d = plan.layout, plan.layout.work, plan.decoding
        save_dir = layout.save_dir(model.normalizer, model.seed)
        yield command_step(
            train_command(layout.data_bin, save_dir, model.normalizer, plan.settings, model.seed, plan.cpu)
        )
        n, ends = self.averages(plan)
        for end in ends:
            checkpoint = save_dir / average_name(n, end)
            yield Step(
                f"# average: {save_dir}/checkpoint{{{end - n + 1}..{end}}}.pt -> {checkpoint} (selection.epoch_average)"
            )
            out = work / "eval" / f"{model.name}-avg{n}-ep{end}"
            yield command_step(_generate_command(plan, checkpoint, "valid", out))
        yield Step(
            f"# select: the average of the best validation BLEU (fairseq's BLEU4 in generate-valid.txt) -> "
            f"{save_dir / SELECTED}, a link to it (selection.train_and_select)"
        )
        out = work / "eval" / f"{model.name}-selected"
        yield command_step(_generate_command(plan, save_dir / SELECTED, "test", out))

        def select():
            _, references_raw = plan.references()
            plan.rows.append(
                train_and_select(
                    layout.data_bin, work, model, plan.settings, self.averages(plan), references_raw, plan.tgt, d
                )
            )

        yield Step(
            f"# score: fairseq's BLEU4 of {out / 'generate-test.txt'}; sacreBLEU and chrF (lowercase) of "
            f"{out / 'test.hyp'} against {layout.references_raw} (selection.score_lowercased)",
            select,
        )

    def report(self, plan, rows):
        """The results' table and each model's validation BLEU per average.

        Args:
            plan: the recipe's Plan.
            rows: the result rows.

        Returns:
            (lines, the note on how tokenized BLEU was computed).
        """
        n = self.averages(plan)[0]
        lines = [
            f"Average of the last {n} epoch checkpoints, the end epoch chosen on validation BLEU"
            " (tok BLEU: fairseq's, on the lowercased tokenised text; BLEU, chrF: sacreBLEU, lowercase):",
            "",
            format_table(_display_rows(rows, plan.seeds), bleu_tok=True),
            "",
        ]
        lines += [
            f"{row['model']} seed {row['seed']}: epochs {row['end_epoch'] - n + 1}-{row['end_epoch']}; validation BLEU "
            + ", ".join(f"ep{end} {bleu:.2f}" for end, bleu in row["valid_bleu"].items())
            for row in rows
        ]
        return lines, est_bleu_note()
