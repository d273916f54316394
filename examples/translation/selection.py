"""The model selection and scores of Zhao et al.'s IWSLT14 de-en recipe: each model's last 10
epoch checkpoints averaged, ending at several epochs (50, 55, ..., 90), each average translating
the validation set; the average with the best validation BLEU translates the test set. BLEU is
fairseq-generate's on the lowercased tokenised text, what the authors' script reads; sacreBLEU and
chrF, case-insensitive, on the detokenised text come besides.
"""

import os
import re
from pathlib import Path

from examples.pipeline.checkpoints import average_checkpoints
from examples.pipeline.corpus import read_lines
from examples.pipeline.evaluation import generate
from examples.pipeline.tokenization import detokenize_lines
from examples.pipeline.tools import PipelineError, ToolError, log
from examples.pipeline.training import train

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


def train_and_select(
    data_bin,
    work,
    variant,
    seed,
    settings,
    average,
    references_raw,
    tgt,
    label=None,
    beam=5,
    lenpen=1.0,
    max_len=None,
):
    """Train one variant with one seed (skipped when trained), average its epoch checkpoints
    at each end epoch, translate the validation set with each average, and the test set with
    the one of the best validation BLEU (the later epoch on a tie).

    Args:
        data_bin: the data-bin.
        work: the work folder (models/ and eval/ go there).
        variant: the attention variant (training.VARIANTS).
        seed: the training seed.
        settings: the TrainSettings (epoch checkpoints, keep_last_epochs covering the averages).
        average: (n, end epochs): how many epoch checkpoints each average takes, and their last
            epochs.
        references_raw: the test references as the corpus has them (sacreBLEU).
        tgt: the target language.
        label: the model's name in progress lines (default: "<variant>-seed<seed>").
        beam: the beam size.
        lenpen: the length penalty.
        max_len: (a, b) caps a translation at a * source length + b tokens.

    Returns:
        A result row: model, seed, selection ("average"), end_epoch (the selected average's
        last epoch), valid_bleu ({end epoch: fairseq BLEU}), checkpoint, hypotheses (their
        file), bleu_tok (fairseq's BLEU on the test set) and its signature, the scores of
        score_lowercased and train_seconds.

    Raises:
        PipelineError: no end epoch has all its checkpoints (training stopped too early).
    """
    name = f"{variant}-seed{seed}"
    label = label or name
    save_dir = Path(work) / "models" / name
    seconds = train(data_bin, save_dir, variant, settings, seed=seed, label=label)
    n, ends = average
    valid_bleu, averages = {}, {}
    for end in ends:
        checkpoint = epoch_average(save_dir, n, end, label)
        if checkpoint is None:
            log(f"{label}: no checkpoints of all epochs {end - n + 1}-{end}: no average ending at epoch {end}")
            continue
        out = Path(work) / "eval" / f"{name}-avg{n}-ep{end}"
        generate(data_bin, checkpoint, "valid", out, beam=beam, lenpen=lenpen, label=label, max_len=max_len)
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
    hypotheses = generate(data_bin, selected, "test", out, beam=beam, lenpen=lenpen, label=label, max_len=max_len)
    scores = score_lowercased(hypotheses, references_raw, tgt)
    scores["bleu_tok"] = fairseq_bleu(out, "test")
    scores["bleu_tok_signature"] = FAIRSEQ_BLEU_SIGNATURE
    log(f"{label}: test BLEU {scores['bleu_tok']:.2f} (fairseq), sacreBLEU {scores['bleu']:.2f}")
    return {
        "model": variant,
        "seed": seed,
        "selection": "average",
        "end_epoch": chosen,
        "valid_bleu": valid_bleu,
        "checkpoint": str(selected),
        "hypotheses": str(out / "test.hyp"),
        **scores,
        "train_seconds": seconds,
    }
