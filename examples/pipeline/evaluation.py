"""Translation of the test set (fairseq-generate) and its scores (sacrebleu: BLEU, chrF,
tokenized BLEU); `train_and_evaluate` runs one model from training to its scores."""

from dataclasses import dataclass
from pathlib import Path

from fairseq_entmax import USER_DIR

from .checkpoints import select_checkpoint
from .corpus import read_lines
from .markers import done_with_same_settings, fingerprint, is_done, mark_done
from .tokenization import SACREBLEU_TOKENIZER, detokenize_lines, scoring_tokenize
from .tools import ToolError, log, run_logged, threads_env, tool, use_cpu
from .training import train


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


def generate_command(data_bin, checkpoint, subset, out_dir, beam=5, lenpen=1.0, max_len=None, cpu=False):
    """The fairseq-generate command that translates a subset.

    Args:
        data_bin: the data-bin.
        checkpoint: the model's checkpoint.
        subset: the subset to translate ("test").
        out_dir: fairseq's --results-path: generate-<subset>.txt is written there.
        beam: the beam size.
        lenpen: the length penalty.
        max_len: (a, b): at most a * source length + b tokens; None: fairseq's default.
        cpu: whether to pass --cpu.

    Returns:
        The command, a list of str.
    """
    args = [
        tool("fairseq-generate"),
        data_bin,
        "--user-dir",
        USER_DIR,
        "--task",
        "translation",
        "--path",
        checkpoint,
        "--gen-subset",
        subset,
        "--beam",
        beam,
        "--lenpen",
        lenpen,
        # (every test sentence is translated: --user-dir repairs fairseq's dropping of a last
        # batch that is not a multiple of --required-batch-size-multiple, evaluation_batches)
        "--max-tokens",
        8000,
        "--remove-bpe",
        "--results-path",
        out_dir,
    ]
    if max_len:
        args += ["--max-len-a", max_len[0], "--max-len-b", max_len[1]]
    if cpu:
        args.append("--cpu")
    return [str(a) for a in args]


def generate(data_bin, checkpoint, subset, out_dir, decoding=DEFAULT_DECODING, label="", threads=None):
    """Translate a subset with fairseq-generate (skipped when done with the same checkpoint
    and settings).

    Args:
        data_bin: the data-bin.
        checkpoint: the model's checkpoint.
        subset: the subset to translate ("test").
        out_dir: where the translations and the log are written.
        decoding: the Decoding.
        label: the model's name in progress lines.
        threads: CPU threads of fairseq-generate (None: torch's choice).

    Returns:
        The hypotheses (BPE removed, still tokenised), a list in corpus order.

    Raises:
        ToolError: fairseq-generate failed or left sentences untranslated.
    """
    out_dir = Path(out_dir)
    hyp_path, marker = out_dir / f"{subset}.hyp", out_dir / f"{subset}.done"
    beam, lenpen, max_len = decoding.beam, decoding.lenpen, decoding.max_len
    made_with = {"checkpoint": fingerprint(checkpoint), "beam": beam, "lenpen": lenpen, "max_len": max_len}
    if hyp_path.exists() and done_with_same_settings(marker, made_with):
        return read_lines(hyp_path)
    if hyp_path.exists() and is_done(marker):
        log(f"{label}: the translations in {out_dir} are of another checkpoint or settings")
    log(f"{label}: translating {subset} (beam {beam})")
    out_dir.mkdir(parents=True, exist_ok=True)
    args = generate_command(data_bin, checkpoint, subset, out_dir, beam, lenpen, max_len, cpu=use_cpu())
    run_logged(args, out_dir / "generate.log", env=threads_env(threads))
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


def train_and_evaluate(
    data_bin, work, model, settings, references, decoding=Decoding(), select="last", average_last=None
):
    """Train one model (skipped when trained), translate the test set and score it.

    Args:
        data_bin: the data-bin.
        work: the work folder (models/ and eval/ go there).
        model: the Model.
        settings: the TrainSettings.
        references: the References it is scored against.
        decoding: the Decoding.
        select: the checkpoint to translate with (select_checkpoint): "last", "best" or
            "average".
        average_last: with "average", how many checkpoints (default: all those kept,
            settings.keep_last_epochs).

    Returns:
        A result row: model, seed, selection, checkpoint, hypotheses (their file), the scores
        of `score` and train_seconds (without the attention analysis).
    """
    name, label = model.name, model.shown
    save_dir = Path(work) / "models" / name
    seconds = train(data_bin, save_dir, model.normalizer, settings, seed=model.seed, label=label, threads=model.threads)
    checkpoint = select_checkpoint(save_dir, select, average_last or settings.keep_last_epochs, label)
    eval_dir = Path(work) / "eval" / (name if select == "last" else f"{name}-{select}")
    hypotheses = generate(data_bin, checkpoint, "test", eval_dir, decoding, label=label, threads=model.threads)
    scores = score(
        hypotheses,
        references.tok,
        references.raw,
        references.tgt,
        tokenized_bleu=references.tokenized_bleu,
        retokenize=references.retokenize,
    )
    shown = [f"tokenized BLEU {scores['bleu_tok']:.2f}"] if references.tokenized_bleu else []
    log(f"{label}: " + ", ".join(shown + [f"BLEU {scores['bleu']:.2f}", f"chrF {scores['chrf']:.2f}"]))
    return {
        "model": model.normalizer,
        "seed": model.seed,
        "selection": select,
        "checkpoint": str(checkpoint),
        "hypotheses": str(eval_dir / "test.hyp"),
        **scores,
        "train_seconds": seconds,
    }
