"""Joint BPE (subword-nmt) and the cleaning of training pairs after it."""

from .corpus import read_lines
from .tools import PipelineError, tool


def learn_bpe_command(joint_text, merges, codes_path):
    """The subword-nmt learn-bpe command.

    Args:
        joint_text: the text to learn from.
        merges: the number of merge operations.
        codes_path: where the codes are written.

    Returns:
        The command, a list of str.
    """
    return [
        str(a)
        for a in [tool("subword-nmt"), "learn-bpe", "--symbols", merges, "--input", joint_text, "--output", codes_path]
    ]


def apply_bpe_command(codes_path, in_path, out_path, workers=1):
    """The subword-nmt apply-bpe command.

    Args:
        codes_path: the BPE codes.
        in_path: the tokenised text.
        out_path: where its segmentation is written.
        workers: subword-nmt's processes.

    Returns:
        The command, a list of str.
    """
    return [
        str(a)
        for a in [
            tool("subword-nmt"),
            "apply-bpe",
            "--codes",
            codes_path,
            "--input",
            in_path,
            "--output",
            out_path,
            "--num-workers",
            workers,
        ]
    ]


def clean_training_pair(bpe_dir, src, tgt, max_len, max_ratio):
    """Drop the training pairs that are empty, too long or too unequal in length, as Moses'
    clean-corpus-n.perl in fairseq's prepare scripts; the files are rewritten in place.

    Args:
        bpe_dir: the folder of the BPE-segmented corpus (a Path; train.SRC, train.TGT).
        src: the source language suffix.
        tgt: the target language suffix.
        max_len: the most tokens a side may have.
        max_ratio: the most the longer side may be of the shorter, as a factor (None: no
            ratio rule).

    Returns:
        (kept, dropped): numbers of pairs.

    Raises:
        PipelineError: no pair is left.
    """
    source_path, target_path = bpe_dir / f"train.{src}", bpe_dir / f"train.{tgt}"
    source_lines = read_lines(source_path)
    target_lines = read_lines(target_path)
    kept_source, kept_target = [], []
    for s, t in zip(source_lines, target_lines):
        ns, nt = len(s.split()), len(t.split())
        ratio_ok = max_ratio is None or max(ns, nt) <= max_ratio * min(ns, nt)
        if 1 <= ns <= max_len and 1 <= nt <= max_len and ratio_ok:
            kept_source.append(s)
            kept_target.append(t)
    if not kept_source:
        raise PipelineError(
            f"no training pair is left after cleaning (1..{max_len} tokens, length ratio <= {max_ratio})"
        )
    source_path.write_text("\n".join(kept_source) + "\n", encoding="utf-8")
    target_path.write_text("\n".join(kept_target) + "\n", encoding="utf-8")
    return len(kept_source), len(source_lines) - len(kept_source)
