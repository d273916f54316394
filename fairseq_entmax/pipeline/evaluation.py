"""Translation of the test set (fairseq-generate) and its scores (sacrebleu: BLEU, chrF,
tokenized BLEU); `model_steps`, the steps of one model from training to its scores."""

from dataclasses import dataclass
from pathlib import Path

from fairseq_entmax import USER_DIR

from .checkpoints import averaged_checkpoint
from .corpus import read_lines
from .markers import done_with_same_settings, fingerprint, is_done, mark_done
from .runner import call_step, command_step
from .tokenization import SACREBLEU_TOKENIZER, detokenize_lines, scoring_tokenize
from .tools import ToolError, log, run_logged, tool
from .training import CPU_ARGS, trained_seconds, training_step, training_summary


@dataclass(frozen=True)
class Decoding:
    """How fairseq-generate searches.

    Attributes:
        beam: the beam size.
        lenpen: the length penalty.
        max_len: (a, b) caps a translation at a * source length + b tokens; None: fairseq's
            default of 200 tokens, which a barely trained model may spend on every sentence.
    """

    beam: int = 5
    lenpen: float = 1.0
    max_len: tuple = None


DEFAULT_DECODING = Decoding()


@dataclass(frozen=True)
class Model:
    """One model to train: a normalizer and a seed.

    Attributes:
        normalizer: the normalizer (fairseq_entmax.names.NORMALIZER_NAMES).
        seed: the training seed.
        label: its name in progress lines (default: "<normalizer>-seed<seed>").
        threads: CPU threads of its fairseq-train and fairseq-generate (None: torch's choice).
    """

    normalizer: str
    seed: int = 1
    label: str = None
    threads: int = None

    @property
    def name(self):
        """The model's folder name: <normalizer>-seed<seed>."""
        return f"{self.normalizer}-seed{self.seed}"

    @property
    def shown(self):
        """The model's name in progress lines."""
        return self.label or self.name


@dataclass(frozen=True)
class References:
    """The references a model's test translations are scored against (see score).

    Attributes:
        tok: the test references, tokenised as the training data was.
        raw: the test references as the corpus has them.
        tgt: the target language.
        tokenized_bleu: whether to score tokenized BLEU too.
        retokenize: tokenized BLEU on the retokenised detokenised text (see score).
    """

    tok: list
    raw: list
    tgt: str
    tokenized_bleu: bool = True
    retokenize: bool = False


@dataclass(frozen=True)
class Translation:
    """fairseq-generate translating a subset with one checkpoint.

    Attributes:
        data_bin: the data-bin.
        checkpoint: the model's checkpoint.
        subset: the subset to translate ("test").
        out_dir: fairseq's --results-path (generate-<subset>.txt), with <subset>.hyp and the log.
        decoding: the Decoding.
        cpu: whether to pass --cpu.
    """

    data_bin: Path
    checkpoint: Path
    subset: str
    out_dir: Path
    decoding: Decoding = DEFAULT_DECODING
    cpu: bool = False

    @property
    def command(self):
        """The fairseq-generate command, a list of str."""
        d = self.decoding
        args = [
            tool("fairseq-generate"),
            self.data_bin,
            "--user-dir",
            USER_DIR,
            "--task",
            "translation",
            "--path",
            self.checkpoint,
            "--gen-subset",
            self.subset,
            "--beam",
            d.beam,
            "--lenpen",
            d.lenpen,
            # (every test sentence is translated: --user-dir repairs fairseq's dropping of a last
            # batch that is not a multiple of --required-batch-size-multiple, evaluation_batches)
            "--max-tokens",
            8000,
            "--remove-bpe",
            "--results-path",
            self.out_dir,
        ]
        if d.max_len:
            args += ["--max-len-a", d.max_len[0], "--max-len-b", d.max_len[1]]
        if self.cpu:
            args += CPU_ARGS
        return [str(a) for a in args]

    def run(self, label="", threads=None):
        """Translate (skipped when done with the same checkpoint, unchanged, and decoding).

        Args:
            label: the model's name in progress lines.
            threads: CPU threads of fairseq-generate (None: torch's choice).

        Returns:
            The hypotheses (BPE removed, still tokenised), a list in corpus order, also
            written to <out_dir>/<subset>.hyp.

        Raises:
            ToolError: fairseq-generate failed or left sentences untranslated.
        """
        out_dir, subset, d = Path(self.out_dir), self.subset, self.decoding
        hyp_path, marker = out_dir / f"{subset}.hyp", out_dir / f"{subset}.done"
        made_with = {
            "checkpoint": fingerprint(self.checkpoint),
            "beam": d.beam,
            "lenpen": d.lenpen,
            "max_len": d.max_len,
        }
        if hyp_path.exists() and done_with_same_settings(marker, made_with):
            return read_lines(hyp_path)
        if hyp_path.exists() and is_done(marker):
            log(f"{label}: the translations in {out_dir} are of another checkpoint or settings")
        log(f"{label}: translating {subset} (beam {d.beam})")
        out_dir.mkdir(parents=True, exist_ok=True)
        run_logged(self.command, out_dir / "generate.log", threads=threads)
        hypotheses = {}
        for line in read_lines(out_dir / f"generate-{subset}.txt"):
            if line.startswith("H-"):
                key, _score, *text = line.split("\t")
                hypotheses[int(key[2:])] = text[0] if text else ""
        missing = sorted(set(range(max(hypotheses, default=-1) + 1)) - set(hypotheses))
        if missing:
            raise ToolError(f"fairseq-generate gave no translation for sentences {missing[:10]} of {subset}")
        ordered = [hypotheses[i] for i in range(len(hypotheses))]
        hyp_path.write_text("\n".join(ordered) + "\n", encoding="utf-8")
        mark_done(marker, settings=made_with)
        return ordered


def score(hypotheses_tok, references_tok, references_raw, tgt_lang, tokenized_bleu=True, retokenize=False):
    """BLEU and chrF with sacrebleu.

    Args:
        hypotheses_tok: the translations, tokenised (as generate returns them).
        references_tok: the references, tokenised as the training data was.
        references_raw: the references as the corpus has them.
        tgt_lang: the target language (its detokeniser and sacreBLEU tokenizer).
        tokenized_bleu: whether to compute `bleu_tok` too (False: the hypotheses are not
            tokenised and are scored as they are).
        retokenize: compute `bleu_tok` on the detokenised hypotheses against the raw
            references, both through `scoring_tokenize`, instead of on the tokenised text.

    Returns:
        {"bleu", "chrf", "bleu_signature", "chrf_signature"}: sacreBLEU on detokenised output
        against the raw references; with `tokenized_bleu`, also "bleu_tok" (BLEU on tokenised
        text, as the paper reports it, multi-bleu.perl) and "bleu_tok_signature".

    Raises:
        ToolError: there are not as many translations as references.
    """
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses_tok) != len(references_tok):
        raise ToolError(f"{len(hypotheses_tok)} translations for {len(references_tok)} references")
    detokenized = detokenize_lines(hypotheses_tok, tgt_lang) if tokenized_bleu else hypotheses_tok
    bleu, chrf = BLEU(tokenize=SACREBLEU_TOKENIZER.get(tgt_lang, "13a")), CHRF()
    result = {
        "bleu": round(bleu.corpus_score(detokenized, [references_raw]).score, 2),
        "chrf": round(chrf.corpus_score(detokenized, [references_raw]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }
    if tokenized_bleu:
        # force: sacrebleu would warn that this text looks tokenised, which it is on purpose.
        bleu_tok = BLEU(tokenize="none", force=True)
        if retokenize:
            hypotheses_tok = scoring_tokenize(detokenized, tgt_lang)
            references_tok = scoring_tokenize(references_raw, tgt_lang)
        result["bleu_tok"] = round(bleu_tok.corpus_score(hypotheses_tok, [references_tok]).score, 2)
        result["bleu_tok_signature"] = str(bleu_tok.get_signature())
    return result


def model_steps(
    data_bin, work, model, settings, references, rows, decoding=DEFAULT_DECODING, selections=("last",), **options
):
    """Train one model, translate the test set with each selected checkpoint and score it, as
    runner Steps.

    Args:
        data_bin: the data-bin.
        work: the work folder (models/ and eval/ go there).
        model: the Model.
        settings: the TrainSettings.
        references: a function giving the References the translations are scored against
            (called once the dataset is built).
        rows: the list each score step appends its result row to.
        decoding: the Decoding.
        selections: the checkpoints that translate the test set, each "last", "best" (the best
            validation metric fairseq saw, TrainSettings.best_metric) or "average" (the
            parameters of the last checkpoints averaged).
        **options: average_last: how many checkpoints "average" takes (default: all those kept,
            settings.keep_last_epochs); cpu: whether fairseq runs on the CPU (--cpu).

    Returns:
        The Steps, a list. Each result row holds model, seed, selection, checkpoint, hypotheses
        (their file), the scores of `score`, train_seconds and training_summary's fields.
    """
    cpu, label, threads = options.get("cpu", False), model.shown, model.threads
    save_dir = Path(work) / "models" / model.name
    steps = [training_step(data_bin, save_dir, model, settings, cpu)]
    for select in selections:
        checkpoint = save_dir / f"checkpoint_{select}.pt"
        if select == "average":
            n = options.get("average_last") or settings.keep_last_epochs
            checkpoint = save_dir / f"checkpoint_avg{n}.pt"
            steps.append(
                call_step(
                    f"# average: the parameters of the last {n} checkpoints of {save_dir} -> {checkpoint} "
                    "(checkpoints.averaged_checkpoint)",
                    lambda n=n: averaged_checkpoint(save_dir, n, label),
                )
            )
        out = Path(work) / "eval" / (model.name if select == "last" else f"{model.name}-{select}")
        translation = Translation(data_bin, checkpoint, "test", out, decoding, cpu)
        steps.append(command_step(translation.command, lambda t=translation: t.run(label, threads)))
        steps.append(
            call_step(
                f"# score: {out / 'test.hyp'} against the test references: BLEU and chrF (evaluation.score)",
                lambda select=select, t=translation: rows.append(_result_row(model, select, t, references())),
            )
        )
    return steps


def _result_row(model, select, translation, references):
    """The scores of a model's test translations, with how it trained."""
    save_dir = Path(translation.checkpoint).parent
    hypotheses = read_lines(translation.out_dir / "test.hyp")
    scores = score(
        hypotheses,
        references.tok,
        references.raw,
        references.tgt,
        tokenized_bleu=references.tokenized_bleu,
        retokenize=references.retokenize,
    )
    shown = [f"tokenized BLEU {scores['bleu_tok']:.2f}"] if references.tokenized_bleu else []
    log(f"{model.shown}: " + ", ".join(shown + [f"BLEU {scores['bleu']:.2f}", f"chrF {scores['chrf']:.2f}"]))
    return {
        "model": model.normalizer,
        "seed": model.seed,
        "selection": select,
        "checkpoint": str(translation.checkpoint),
        "hypotheses": str(translation.out_dir / "test.hyp"),
        **scores,
        "train_seconds": trained_seconds(save_dir),
        **training_summary(save_dir / "train.log"),
    }
