"""fairseq-entmax-analyze: what the attention heads of fairseq checkpoints learned.

Example:
    fairseq-entmax-analyze data-bin/iwslt14.tokenized.de-en \\
        --path checkpoints/softmax/checkpoint_best.pt --path checkpoints/alpha/checkpoint_best.pt \\
        --subset valid --num-sentences 500 --output-dir analysis/
"""

import argparse
import logging
import sys

from fairseq_entmax.analysis.options import AnalysisOptions

# fairseq-entmax-analyze's options: (flags, add_argument's keywords).
OPTIONS = [
    (("data",), dict(help="fairseq data-bin directory the models were trained on")),
    (
        ("--path",),
        dict(
            action="append",
            required=True,
            metavar="CHECKPOINT",
            help="checkpoint to analyze; repeat to compare several models",
        ),
    ),
    (
        ("--name",),
        dict(
            action="append",
            metavar="NAME",
            help="label of the model, once per --path (default: the checkpoint's directory)",
        ),
    ),
    (
        ("--train-log",),
        dict(
            action="append",
            metavar="PATH",
            help="training log file (fairseq's log lines) or tensorboard log directory with the alpha "
            "values and validations, once per --path in the same order; 'auto' (the default) "
            "reads the --tensorboard-logdir or --log-file recorded in the checkpoint, if it still "
            "exists. The validations give learning_curves.png, where models whose --name differ "
            "only by a -seed<N>/_seed<N> ending are averaged",
        ),
    ),
    (
        ("--user-dir",),
        dict(
            help="a fairseq plugin folder the models need besides this one, which is always loaded "
            "(this package's folder or fairseq_entmax.USER_DIR are accepted and add nothing)"
        ),
    ),
    (
        ("--subset", "--gen-subset"),
        dict(
            dest="subset",
            default="valid",
            help="data subset to run over (default: valid); --gen-subset is fairseq's spelling",
        ),
    ),
    (("--output-dir",), dict(required=True, help="where analysis.json, the tables and figures go")),
    (
        ("--num-sentences",),
        dict(type=int, metavar="N", help="analyze only the first N sentences of the subset (default: all)"),
    ),
    (("--max-tokens",), dict(type=int, default=4000, help="tokens per batch (default: 4000)")),
    (("--batch-size",), dict(type=int, help="sentences per batch (default: limited by --max-tokens)")),
    (
        ("--sentence-id",),
        dict(
            type=int,
            default=0,
            help="sentence of the subset (0-based line) whose attention maps are drawn (default: 0)",
        ),
    ),
    (
        ("--positional-threshold",),
        dict(
            type=float,
            default=0.9,
            help="list heads whose average weight on the previous or next token is at least this (default: 0.9)",
        ),
    ),
    (
        ("--bpe-threshold",),
        dict(
            type=float,
            default=0.5,
            help="list heads whose average weight on the other pieces of the current word is at least this "
            "(default: 0.5)",
        ),
    ),
    (
        ("--interrogation-threshold",),
        dict(
            type=float,
            default=0.5,
            help="list heads whose average weight on the question marks ('?' tokens) of the sentence is at least "
            "this, over the queries that can see one (default: 0.5)",
        ),
    ),
    (("--cpu",), dict(action="store_true", help="run on the CPU even if a GPU is available")),
    (("--no-figures",), dict(action="store_true", help="write analysis.json and the tables only")),
]


def build_parser():
    """The command line of fairseq-entmax-analyze (OPTIONS).

    Returns:
        An argparse.ArgumentParser.
    """
    parser = argparse.ArgumentParser(
        prog="fairseq-entmax-analyze",
        description="Run fairseq checkpoints over a subset with teacher forcing and write analysis.json, CSV "
        "tables and PNG figures about their attention heads: learned alpha, attention density, "
        "head diversity (JS), positional, BPE-merging and interrogation heads, per-head attention maps.",
    )
    for flags, keywords in OPTIONS:
        parser.add_argument(*flags, **keywords)
    return parser


def main(argv=None):
    """The console script fairseq-entmax-analyze.

    Args:
        argv: the command-line arguments (default: sys.argv[1:]).

    Returns:
        The exit status: 0, or 2 when an input is bad (the message, on stderr, says what to fix).
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        options = AnalysisOptions(
            subset=args.subset,
            user_dir=args.user_dir,
            num_sentences=args.num_sentences,
            max_tokens=args.max_tokens,
            batch_size=args.batch_size,
            sentence_id=args.sentence_id,
            positional_threshold=args.positional_threshold,
            bpe_threshold=args.bpe_threshold,
            interrogation_threshold=args.interrogation_threshold,
            device="cpu" if args.cpu else None,
            figures=not args.no_figures,
        )
    except ValueError as error:
        parser.error(str(error))
    logging.basicConfig(
        format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
        level=logging.INFO,
        stream=sys.stdout,
        force=True,
    )
    from fairseq_entmax.analysis.pipeline import analyze
    from fairseq_entmax.repairs.checkpoint_safety import UnsafeCheckpointError

    try:
        analyze(args.path, args.data, args.output_dir, options=options, names=args.name, train_logs=args.train_log)
    except (FileNotFoundError, ValueError, UnsafeCheckpointError) as error:
        print(f"fairseq-entmax-analyze: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
