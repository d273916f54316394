"""The data stage end to end, as runner steps: raw text -> Moses tokenisation -> joint BPE ->
cleaning -> fairseq-preprocess (binarisation), each stage skipped when done with the same
settings."""

import dataclasses
import shlex
import shutil
from pathlib import Path

from .bpe import apply_bpe_command, clean_training_pair, learn_bpe_command
from .corpus import SPLITS
from .markers import done_with, mark_done
from .runner import call_step, command_step
from .tokenization import CHARACTER_SEGMENTED_LANGS, tokenize_file
from .tools import log, run_logged, tool


def preprocess_command(text_dir, src, tgt, dest_dir, workers=1, joined_dictionary=True):
    """The fairseq-preprocess command.

    Args:
        text_dir: the folder of {train,valid,test}.{SRC,TGT}.
        src: the source language suffix.
        tgt: the target language suffix.
        dest_dir: the data-bin to write.
        workers: fairseq-preprocess's processes.
        joined_dictionary: one dictionary for both languages, which joint BPE allows and
            --share-all-embeddings needs (False: one per language).

    Returns:
        The command, a list of str.
    """
    return [
        str(a)
        for a in [
            tool("fairseq-preprocess"),
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            Path(text_dir) / "train",
            "--validpref",
            Path(text_dir) / "valid",
            "--testpref",
            Path(text_dir) / "test",
            "--destdir",
            dest_dir,
            *(["--joined-dictionary"] if joined_dictionary else []),
            "--workers",
            workers,
        ]
    ]


def dataset_steps(
    raw_dir, src, tgt, work, bpe_merges, tokenize=True, clean=(250, 1.5), workers=1, joined_dictionary=True
):
    """raw text -> [Moses tokenisation] -> joint BPE [+ cleaning of training pairs] ->
    fairseq-preprocess, as runner Steps; a run skips each stage done with the same settings.

    Args:
        raw_dir: the folder of the raw corpus, {train,valid,test}.{SRC,TGT}.
        src: the source language suffix.
        tgt: the target language suffix.
        work: the work folder: tok/, bpe/ and data-bin/ are made in it.
        bpe_merges: the number of joint BPE merges.
        tokenize: whether to Moses-tokenise first (False: the raw text is tokenised already).
        clean: (max_len, max_ratio) for clean_training_pair, or None: no cleaning.
        workers: processes for each tool.
        joined_dictionary: binarise with one dictionary for both languages (False: one each).

    Returns:
        (steps, tokenised text folder, data-bin folder): the text folder is raw_dir when
        `tokenize` is False. A step raises PipelineError when its stage was done with other
        settings or cleaning left no pair, ToolError when a tool failed.
    """
    work = Path(work)
    text_dir = work / "tok" if tokenize else Path(raw_dir)
    # The corpus by its folder, relative to the work dir when inside it (a moved work dir
    # still matches its markers).
    raw, resolved_work = Path(raw_dir).resolve(), work.resolve()
    inside = raw.is_relative_to(resolved_work)
    corpus = {"raw_dir": str(raw.relative_to(resolved_work) if inside else raw), "src": src, "tgt": tgt}
    steps = _tokenize_steps(Path(raw_dir), text_dir, corpus, workers) if tokenize else []
    bpe_settings = {**corpus, "tokenized": tokenize, "merges": bpe_merges, "clean": clean}
    steps += _bpe_steps(text_dir, work / "bpe", bpe_settings, workers)
    data_bin = work / "data-bin"
    binarized = {**bpe_settings, "joined_dictionary": joined_dictionary}
    marker = data_bin / "preprocess.done"
    command = preprocess_command(work / "bpe", src, tgt, data_bin, workers, joined_dictionary)

    def binarize():
        log("binarize: fairseq-preprocess" + ("" if joined_dictionary else ", a dictionary per language"))
        # fairseq-preprocess refuses a destination that holds a dictionary already, which an
        # interrupted run leaves behind: start from an empty folder.
        shutil.rmtree(data_bin, ignore_errors=True)
        run_logged(command, work / "preprocess.log")
        mark_done(marker, settings=binarized)

    def binarized_before():
        return done_with(marker, binarized, "the binarized data", defaults={"joined_dictionary": True})

    steps.append(command_step(command, binarize, skip=binarized_before))
    return steps, text_dir, data_bin


def _tokenize_steps(raw_dir, text_dir, corpus, workers):
    """The tokenize stage: one Python step, Moses on every file (skipped when done)."""
    src, tgt, marker = corpus["src"], corpus["tgt"], text_dir / "tokenize.done"

    def tokenize():
        split_characters = {src, tgt} & set(CHARACTER_SEGMENTED_LANGS)
        log("tokenize: Moses (sacremoses)" + ("; ja/zh split into characters" if split_characters else ""))
        text_dir.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            for lang in (src, tgt):
                tokenize_file(raw_dir / f"{split}.{lang}", text_dir / f"{split}.{lang}", lang, workers=workers)
        mark_done(marker, settings=corpus)

    line = (
        f"# tokenize: Moses (sacremoses, -a, no escaping) {raw_dir}/{{train,valid,test}}.{{{src},{tgt}}}"
        f" -> {text_dir} (tokenization.tokenize_file)"
    )
    return [call_step(line, tokenize, skip=lambda: done_with(marker, corpus, "the tokenized corpus"))]


def _bpe_steps(text_dir, bpe_dir, settings, workers):
    """The bpe stage: the joint training text, learn-bpe, apply-bpe on every file and the
    cleaning, each skipped when the stage is done; the last marks it done."""
    src, tgt, merges, clean = settings["src"], settings["tgt"], settings["merges"], settings["clean"]
    marker, codes, bpe_log = bpe_dir / "bpe.done", bpe_dir / "codes", bpe_dir / "bpe.log"
    joint = bpe_dir / "codes.joint-train.txt"
    info = {}

    def done_before():
        return done_with(marker, settings, "the BPE-segmented corpus")

    def join_training_text():
        # Joint BPE, as in the paper: learnt on both training sides together.
        log(f"bpe: learning {merges} joint merges (subword-nmt)")
        bpe_dir.mkdir(parents=True, exist_ok=True)
        with open(joint, "w", encoding="utf-8") as out:
            for lang in (src, tgt):
                out.write((text_dir / f"train.{lang}").read_text(encoding="utf-8"))

    learn = learn_bpe_command(joint, merges, codes)
    steps = [
        call_step(
            f"cat {shlex.quote(str(text_dir / f'train.{src}'))} {shlex.quote(str(text_dir / f'train.{tgt}'))}"
            f" > {shlex.quote(str(joint))}",
            join_training_text,
            skip=done_before,
        ),
        command_step(learn, lambda: (run_logged(learn, bpe_log), joint.unlink()), skip=done_before),
    ]
    for split in SPLITS:
        for lang in (src, tgt):
            apply = apply_bpe_command(codes, text_dir / f"{split}.{lang}", bpe_dir / f"{split}.{lang}", workers)
            steps.append(command_step(apply, lambda apply=apply: run_logged(apply, bpe_log), skip=done_before))
    if clean:
        max_len, ratio = clean
        rule = f"empty, > {max_len} tokens" + (f" or of length ratio > {ratio}" if ratio else "")

        def drop_pairs():
            kept, dropped = clean_training_pair(bpe_dir, src, tgt, max_len, ratio)
            log(f"bpe: {kept} training pairs kept, {dropped} dropped ({rule})")
            info.update(kept=kept, dropped=dropped)

        steps.append(
            call_step(
                f"# bpe: drop training pairs that are {rule} (bpe.clean_training_pair)", drop_pairs, skip=done_before
            )
        )
    last = steps[-1]

    def last_then_mark():
        last.action()
        mark_done(marker, info, settings=settings)

    steps[-1] = dataclasses.replace(last, action=last_then_mark)
    return steps
