"""The data stage end to end: raw text -> Moses tokenisation -> joint BPE -> cleaning ->
fairseq-preprocess (binarisation), each step skipped when done with the same settings."""

import shutil
from pathlib import Path

from .bpe import apply_bpe, clean_training_pair, learn_joint_bpe
from .corpus import SPLITS
from .markers import done_with, mark_done
from .tokenization import CHARACTER_SEGMENTED_LANGS, tokenize_file
from .tools import log, run_logged, tool


def binarize(text_dir, src, tgt, dest_dir, log_path, workers=1, joined_dictionary=True):
    """Binarise a segmented corpus with fairseq-preprocess, into an emptied folder.

    Args:
        text_dir: the folder of {train,valid,test}.{SRC,TGT}.
        src: the source language suffix.
        tgt: the target language suffix.
        dest_dir: the data-bin to write (emptied first).
        log_path: fairseq-preprocess's log, appended to.
        workers: fairseq-preprocess's processes.
        joined_dictionary: one dictionary for both languages (False: one per language).
    """
    # fairseq-preprocess refuses a destination that holds a dictionary already, which an
    # interrupted run leaves behind: start from an empty folder.
    shutil.rmtree(dest_dir, ignore_errors=True)
    run_logged(preprocess_command(text_dir, src, tgt, dest_dir, workers, joined_dictionary), log_path)


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


def build_dataset(
    raw_dir, src, tgt, work, bpe_merges, tokenize=True, clean=(250, 1.5), workers=1, joined_dictionary=True
):
    """raw text -> [Moses tokenisation] -> joint BPE [+ cleaning of training pairs] ->
    fairseq-preprocess, each step skipped when done with the same settings.

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
        (tokenised text folder, data-bin folder): the first is raw_dir when `tokenize` is False.

    Raises:
        PipelineError: a stage was done with other settings, or cleaning left no pair.
        ToolError: a tool failed.
    """
    work = Path(work)
    text_dir = work / "tok" if tokenize else Path(raw_dir)
    # The corpus by its folder, relative to the work dir when inside it (a moved work dir
    # still matches its markers).
    raw, resolved_work = Path(raw_dir).resolve(), work.resolve()
    inside = raw.is_relative_to(resolved_work)
    corpus = {"raw_dir": str(raw.relative_to(resolved_work) if inside else raw), "src": src, "tgt": tgt}
    if tokenize and not done_with(text_dir / "tokenize.done", corpus, "the tokenized corpus"):
        log(
            "tokenize: Moses (sacremoses)"
            + ("; ja/zh split into characters" if {src, tgt} & set(CHARACTER_SEGMENTED_LANGS) else "")
        )
        text_dir.mkdir(parents=True, exist_ok=True)
        for split in SPLITS:
            for lang in (src, tgt):
                tokenize_file(Path(raw_dir) / f"{split}.{lang}", text_dir / f"{split}.{lang}", lang, workers=workers)
        mark_done(text_dir / "tokenize.done", settings=corpus)
    bpe_dir = work / "bpe"
    bpe_settings = {**corpus, "tokenized": tokenize, "merges": bpe_merges, "clean": clean}
    if not done_with(bpe_dir / "bpe.done", bpe_settings, "the BPE-segmented corpus"):
        log(f"bpe: learning {bpe_merges} joint merges (subword-nmt)")
        bpe_dir.mkdir(parents=True, exist_ok=True)
        codes = bpe_dir / "codes"
        learn_joint_bpe(text_dir / f"train.{src}", text_dir / f"train.{tgt}", bpe_merges, codes, bpe_dir / "bpe.log")
        for split in SPLITS:
            for lang in (src, tgt):
                apply_bpe(
                    codes,
                    text_dir / f"{split}.{lang}",
                    bpe_dir / f"{split}.{lang}",
                    bpe_dir / "bpe.log",
                    workers=workers,
                )
        info = {}
        if clean:
            kept, dropped = clean_training_pair(bpe_dir, src, tgt, *clean)
            rule = f"empty, > {clean[0]} tokens" + (f" or length ratio > {clean[1]}" if clean[1] else "")
            log(f"bpe: {kept} training pairs kept, {dropped} dropped ({rule})")
            info = {"kept": kept, "dropped": dropped}
        mark_done(bpe_dir / "bpe.done", info, settings=bpe_settings)
    data_bin = work / "data-bin"
    binarized_settings = {**bpe_settings, "joined_dictionary": joined_dictionary}
    if not done_with(
        data_bin / "preprocess.done", binarized_settings, "the binarized data", defaults={"joined_dictionary": True}
    ):
        log("binarize: fairseq-preprocess" + ("" if joined_dictionary else ", a dictionary per language"))
        binarize(
            bpe_dir, src, tgt, data_bin, work / "preprocess.log", workers=workers, joined_dictionary=joined_dictionary
        )
        mark_done(data_bin / "preprocess.done", settings=binarized_settings)
    return text_dir, data_bin
