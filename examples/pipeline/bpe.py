"""Joint BPE (subword-nmt) and the cleaning of training pairs after it."""

from pathlib import Path

from .corpus import read_lines
from .tools import PipelineError, run_logged, tool


def learn_joint_bpe(train_source, train_target, merges, codes_path, log_path):
    """Joint BPE on the concatenation of both training sides, as in the paper (subword-nmt)."""
    joint = Path(codes_path).with_suffix(".joint-train.txt")
    with open(joint, "w", encoding="utf-8") as out:
        for path in (train_source, train_target):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    out.write(line)
    run_logged(learn_bpe_command(joint, merges, codes_path), log_path)
    joint.unlink()


def learn_bpe_command(joint_text, merges, codes_path):
    return [
        str(a)
        for a in [tool("subword-nmt"), "learn-bpe", "--symbols", merges, "--input", joint_text, "--output", codes_path]
    ]


def apply_bpe_command(codes_path, in_path, out_path, workers=1):
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


def apply_bpe(codes_path, in_path, out_path, log_path, workers=1):
    run_logged(apply_bpe_command(codes_path, in_path, out_path, workers), log_path)


def clean_training_pair(bpe_dir, src, tgt, max_len, max_ratio):
    """Drop training pairs that are empty, longer than max_len tokens, or whose length ratio
    exceeds max_ratio (None: no ratio rule), as Moses' clean-corpus-n.perl in fairseq's
    prepare scripts.
    Returns (kept, dropped)."""
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
