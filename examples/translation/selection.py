"""How a recipe's Experiment selects, translates and scores each model, as runner Steps:
BestCheckpoint, Correia et al.'s checkpoint_best.pt (and, on request, an average of the last
checkpoints); EpochAverages, Zhao et al.'s IWSLT14 de-en selection: each model's last 10
epoch checkpoints averaged, ending at several epochs (50, 55, ..., 90), each average translating
the validation set; the average with the best validation BLEU translates the test set. Its BLEU
is fairseq-generate's on the lowercased tokenised text, what the authors' script reads; sacreBLEU
and chrF, case-insensitive, on the detokenised text come besides.
"""

import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path

from fairseq_entmax.pipeline.checkpoints import average_checkpoints
from fairseq_entmax.pipeline.corpus import read_lines
from fairseq_entmax.pipeline.evaluation import References, Translation, model_steps
from fairseq_entmax.pipeline.runner import call_step, command_step
from fairseq_entmax.pipeline.tables import format_table
from fairseq_entmax.pipeline.tokenization import detokenize_lines
from fairseq_entmax.pipeline.tools import PipelineError, ToolError, log
from fairseq_entmax.pipeline.training import trained_seconds, training_step

# The selected average, a symbolic link in the model's folder: the test set is translated with it.
SELECTED = "checkpoint_selected.pt"
FAIRSEQ_BLEU_SIGNATURE = "fairseq-generate BLEU4 (--remove-bpe) on the lowercased Moses-tokenised text"
_FAIRSEQ_BLEU = re.compile(r"^Generate \S+ with beam=\d+: BLEU4 = ([\d.]+)")


def average_name(n, end):
    """The file name of an average of epoch checkpoints.

    Args: n: how many epochs it averages; end: its last epoch.
    Returns: checkpoint_avg{n}_ep{end}.pt.
    """
    return f"checkpoint_avg{n}_ep{end}.pt"


def epoch_average(save_dir, n, end, label):
    """The average of checkpoint{end-n+1}.pt ... checkpoint{end}.pt, as fairseq's average_checkpoints.py
    --num-epoch-checkpoints n --checkpoint-upper-bound end makes it (made once).

    Args: save_dir: the model's --save-dir; n: how many epoch checkpoints; end: the last epoch; label: the
    model's name in progress lines.
    Returns: The averaged checkpoint's path, or None when an epoch checkpoint of the range is missing.
    """
    save_dir = Path(save_dir)
    out = save_dir / average_name(n, end)
    if out.exists():
        return out
    paths = [save_dir / f"checkpoint{epoch}.pt" for epoch in range(end - n + 1, end + 1)]
    if not all(path.exists() for path in paths):
        log(f"{label}: no checkpoints of all epochs {end - n + 1}-{end}: no average ending at epoch {end}")
        return None
    log(f"{label}: averaging the checkpoints of epochs {end - n + 1}-{end}")
    # Written under another name first: an interrupted average is not taken for a finished one.
    partial = out.with_suffix(".part")
    average_checkpoints(paths, partial)
    partial.rename(out)
    return out


def fairseq_bleu(out_dir, subset):
    """fairseq-generate's BLEU of a translated subset, from the last line of its output.

    Args: out_dir: the --results-path of fairseq-generate; subset: the subset translated.
    Returns: BLEU4, a float.
    Raises ToolError: the output has no BLEU line.
    """
    path = Path(out_dir) / f"generate-{subset}.txt"
    for line in reversed(read_lines(path)):
        found = _FAIRSEQ_BLEU.match(line)
        if found:
            return float(found.group(1))
    raise ToolError(f"{path} has no BLEU4 line: did fairseq-generate finish?")


def score_lowercased(hypotheses_tok, references_raw, tgt):
    """sacreBLEU's BLEU and chrF of the translations, case-insensitive: the recipe's text is lowercased, the
    references are not.

    Args: hypotheses_tok: the translations, tokenised and lowercased (as generate returns them);
    references_raw: the references as the corpus has them; tgt: the target language (its Moses detokeniser).
    Returns: {"bleu", "chrf", "bleu_signature", "chrf_signature"}.
    Raises ToolError: there are not as many translations as references.
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

    Returns: A sentence.
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


def select_average(save_dir, n, translations, label):
    """Select the average of the best validation BLEU (the later epoch on a tie), linked as SELECTED in the
    model's folder.

    Args: save_dir: the model's --save-dir; n: how many epoch checkpoints each average takes; translations:
    {end epoch: the Translation of the validation set by that average}; those whose average could not be made
    (an epoch checkpoint missing) are passed over; label: the model's name in progress lines.
    Returns: (the chosen end epoch, {end epoch: fairseq's validation BLEU}).
    Raises PipelineError: no end epoch has all its checkpoints (training stopped too early).
    """
    valid_bleu = {end: fairseq_bleu(t.out_dir, "valid") for end, t in translations.items() if t.checkpoint.exists()}
    if not valid_bleu:
        raise PipelineError(
            f"{label}: {save_dir} has no {n} consecutive epoch checkpoints ending at any of epochs "
            f"{', '.join(map(str, translations))}: did training stop early (--max-update)? "
            "Delete the folder and train again."
        )
    chosen = max(valid_bleu, key=lambda end: (valid_bleu[end], end))
    log(
        f"{label}: validation BLEU "
        + ", ".join(f"ep{end} {bleu:.2f}" for end, bleu in valid_bleu.items())
        + f"; selected the average ending at epoch {chosen}"
    )
    _select(save_dir, translations[chosen].checkpoint)
    return chosen, valid_bleu


def _display_rows(rows, seeds):
    # With several seeds, each row names its seed.
    return [dict(row, model=f"{row['model']} (seed {row['seed']})") if len(seeds) > 1 else row for row in rows]


@dataclass(frozen=True)
class BestCheckpoint:
    """Correia et al.'s selection: checkpoint_best.pt (the best validation accuracy) translates the test set;
    with --average-last N, the average of the last N checkpoints too, reported apart.
    """

    # The selection whose checkpoint the attention analysis reads.
    reported = "best"
    allows_average_last = True

    def settings(self, settings, plan):
        """The TrainSettings, keeping enough checkpoints for --average-last.

        Args: settings: the TrainSettings of the task; plan: the recipe's Plan.
        Returns: A TrainSettings.
        """
        if not plan.average_last:
            return settings
        return dataclasses.replace(settings, keep_last_epochs=max(settings.keep_last_epochs, plan.average_last))

    def analyzed_checkpoint(self, save_dir):
        """The checkpoint of a model that the attention analysis reads.

        Args: save_dir: the model's --save-dir.
        Returns: Its path.
        """
        return save_dir / "checkpoint_best.pt"

    def model_steps(self, plan, model):
        """Train one model, translate the test set with each selected checkpoint and score it.

        Args: plan: the recipe's Plan; model: the Model (evaluation.Model).
        Returns: evaluation.model_steps' Steps; each score step appends a result row to plan.rows.
        """
        layout = plan.layout

        def references():
            return References(*plan.references(), plan.tgt, retokenize=layout.tokenize)

        selections = ("best",) + (("average",) if plan.average_last else ())
        return model_steps(
            layout.data_bin,
            layout.work,
            model,
            plan.settings,
            references,
            plan.rows,
            plan.decoding,
            selections,
            average_last=plan.average_last,
            cpu=plan.cpu,
        )

    def report(self, plan, rows):
        """The results' tables.

        Args: plan: the recipe's Plan; rows: the result rows.
        Returns: (lines, the note on how tokenized BLEU was computed).
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


def _selected_row(model, test, chosen, plan):
    """The result row of a model's selected average (EpochAverages)."""
    _, references_raw = plan.references()
    scores = score_lowercased(read_lines(test.out_dir / "test.hyp"), references_raw, plan.tgt)
    scores["bleu_tok"] = fairseq_bleu(test.out_dir, "test")
    scores["bleu_tok_signature"] = FAIRSEQ_BLEU_SIGNATURE
    log(f"{model.shown}: test BLEU {scores['bleu_tok']:.2f} (fairseq), sacreBLEU {scores['bleu']:.2f}")
    save_dir = test.checkpoint.parent
    return {
        "model": model.normalizer,
        "seed": model.seed,
        "selection": "average",
        **chosen,
        "checkpoint": str(test.checkpoint),
        "hypotheses": str(test.out_dir / "test.hyp"),
        **scores,
        "train_seconds": trained_seconds(save_dir),
    }


@dataclass(frozen=True)
class EpochAverages:
    """Zhao et al.'s selection: averages of the last n epoch checkpoints ending at several epochs translate the
    validation set, the best of them the test set (select_average).

    Attributes: average: (n, end epochs) of a full run; smoke_average: (n, end epochs) of the smoke mode.
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

        Args: settings: the TrainSettings of the task; plan: the recipe's Plan.
        Returns: settings.
        """
        return settings

    def analyzed_checkpoint(self, save_dir):
        """The checkpoint of a model that the attention analysis reads.

        Args: save_dir: the model's --save-dir.
        Returns: Its path: the link to the selected average.
        """
        return save_dir / SELECTED

    def model_steps(self, plan, model):
        """Train one model, translate the validation set with each average, the test set with the best, and score
        it.

        Args: plan: the recipe's Plan; model: the Model (evaluation.Model).
        Yields: Steps; the score step appends the result row to plan.rows.
        """
        layout, work, label, cpu = plan.layout, plan.layout.work, model.shown, plan.cpu
        data_bin, settings = layout.data_bin, plan.settings
        save_dir = layout.save_dir(model.normalizer, model.seed)
        yield training_step(data_bin, save_dir, model, settings, cpu)
        n, ends = self.averages(plan)
        valid = {}
        for end in ends:
            checkpoint = save_dir / average_name(n, end)
            yield call_step(
                f"# average: {save_dir}/checkpoint{{{end - n + 1}..{end}}}.pt -> {checkpoint} "
                "(selection.epoch_average)",
                lambda end=end: epoch_average(save_dir, n, end, label),
            )
            valid[end] = Translation(
                data_bin, checkpoint, "valid", work / "eval" / f"{model.name}-avg{n}-ep{end}", plan.decoding, cpu
            )
            # An average that could not be made (an epoch checkpoint missing) translates nothing.
            yield command_step(
                valid[end].command, lambda t=valid[end]: t.run(label), skip=lambda c=checkpoint: not c.exists()
            )
        chosen = {}
        yield call_step(
            f"# select: the average of the best validation BLEU (fairseq's BLEU4 in generate-valid.txt) -> "
            f"{save_dir / SELECTED}, a link to it (selection.select_average)",
            lambda: chosen.update(zip(("end_epoch", "valid_bleu"), select_average(save_dir, n, valid, label))),
        )
        test = Translation(
            data_bin, save_dir / SELECTED, "test", work / "eval" / f"{model.name}-selected", plan.decoding, cpu
        )
        yield command_step(test.command, lambda: test.run(label))
        yield call_step(
            f"# score: fairseq's BLEU4 of {test.out_dir / 'generate-test.txt'}; sacreBLEU and chrF (lowercase) of "
            f"{test.out_dir / 'test.hyp'} against {layout.references_raw} (selection.score_lowercased)",
            lambda: plan.rows.append(_selected_row(model, test, chosen, plan)),
        )

    def report(self, plan, rows):
        """The results' table and each model's validation BLEU per average.

        Args: plan: the recipe's Plan; rows: the result rows.
        Returns: (lines, the note on how tokenized BLEU was computed).
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
