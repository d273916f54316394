"""Quickstart (`make demo`): softmax, 1.5-entmax, learned alpha-entmax and top-k attention,
trained and compared end to end with fairseq on a toy language pair, on a CPU in minutes.

    .venv/bin/python examples/quickstart/quickstart.py                  # the toy pair, ~10 min on 2 cores
    .venv/bin/python examples/quickstart/quickstart.py --data DIR --src de --tgt en   # your corpus

Stages: corpus (generated, or yours: DIR/{train,valid,test}.{src,tgt}, raw text, one sentence
per line) -> Moses tokenisation (your corpus only) -> joint BPE (subword-nmt) ->
fairseq-preprocess -> fairseq-train per attention variant -> fairseq-generate on test ->
sacreBLEU BLEU and chrF -> fairseq-entmax-analyze (attention density, learned alphas,
figures) -> one table. Everything goes to --work-dir; a second run skips finished stages and
resumes an interrupted training from its last checkpoint.
"""
import argparse
import json
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from entmax_recipes import pipeline  # noqa: E402
from entmax_recipes.pipeline import PipelineError, TrainSettings, log  # noqa: E402
from toy_language import write_toy_corpus  # noqa: E402

# Sizes chosen so the four models together train in about 8 minutes on 2 CPU cores and
# reach a clearly non-zero BLEU on the toy pair; --tiny is the test suite's size.
SIZES = {
    "demo": {"n_train": 20000, "n_eval": 500, "bpe_merges": 300, "max_update": 300, "max_tokens": 4096,
             "warmup": 150, "layers": 2, "dim": 128, "ffn": 256, "heads": 4, "topk": 4},
    "tiny": {"n_train": 600, "n_eval": 40, "bpe_merges": 100, "max_update": 20, "max_tokens": 1024,
             "warmup": 10, "layers": 1, "dim": 32, "ffn": 64, "heads": 2, "topk": 2},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="directory with your corpus: {train,valid,test}.{SRC,TGT}, "
                        "raw text, one sentence per line (default: the generated toy pair)")
    parser.add_argument("--src", help="source language code (file suffix), with --data")
    parser.add_argument("--tgt", help="target language code (file suffix), with --data")
    parser.add_argument("--work-dir", type=Path, help="where everything is written (default: runs/quickstart "
                        "or runs/quickstart-<data folder name>)")
    parser.add_argument("--models", nargs="+", default=list(pipeline.VARIANTS), choices=pipeline.VARIANTS,
                        help="attention variants to train (default: all four)")
    parser.add_argument("--max-update", type=int, help="training updates per model (default: %d)" % SIZES["demo"]["max_update"])
    parser.add_argument("--bpe-merges", type=int, help="BPE merge operations")
    parser.add_argument("--tiny", action="store_true", help="a very small run (a few seconds per model), for tests")
    parser.add_argument("--threads", type=int, help="CPU threads per fairseq process (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.data is None and (args.src or args.tgt):
        parser.error("--src/--tgt name the files of your corpus: give --data DIR as well")
    if args.data is not None:
        if not (args.src and args.tgt):
            parser.error("--data needs --src and --tgt, the language suffixes of its files (e.g. --src de --tgt en)")
        if args.src == args.tgt:
            parser.error(f"--src and --tgt are both {args.src!r}: give two different languages")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run(args):
    size = dict(SIZES["tiny" if args.tiny else "demo"])
    if args.max_update:
        size["max_update"] = args.max_update
    if args.bpe_merges:
        size["bpe_merges"] = args.bpe_merges
    own_corpus = args.data is not None
    work = args.work_dir or Path("runs") / ("quickstart-" + args.data.resolve().name if own_corpus else "quickstart")
    work = work.resolve()
    started = time.time()

    # 1. Corpus, checked before anything long starts.
    if own_corpus:
        raw_dir, src, tgt = args.data, args.src, args.tgt
    else:
        raw_dir = work / "raw"
        if not pipeline.is_done(raw_dir / "corpus.done"):
            log(f"writing the toy corpus to {raw_dir}")
            n_eval = size["n_eval"]
            write_toy_corpus(raw_dir, n_train=size["n_train"], n_valid=n_eval, n_test=n_eval)
            pipeline.mark_done(raw_dir / "corpus.done")
        src, tgt = "svo", "sov"
    files = {split: (raw_dir / f"{split}.{src}", raw_dir / f"{split}.{tgt}") for split in pipeline.SPLITS}
    counts = pipeline.check_parallel_corpus(files)
    log(f"corpus {raw_dir} {src}->{tgt}: " + ", ".join(f"{s} {n} lines" for s, n in counts.items()))
    work.mkdir(parents=True, exist_ok=True)

    # 2. Tokenisation (raw text of the user's corpus; the toy pair is already tokenised).
    if own_corpus:
        text_dir = work / "tok"
        if not pipeline.is_done(text_dir / "tokenize.done"):
            log("Moses tokenisation (sacremoses)")
            text_dir.mkdir(parents=True, exist_ok=True)
            for split, pair in files.items():
                for lang, path in zip((src, tgt), pair):
                    pipeline.tokenize_file(path, text_dir / f"{split}.{lang}", lang)
            pipeline.mark_done(text_dir / "tokenize.done")
    else:
        text_dir = raw_dir

    # 3. Joint BPE, 4. fairseq-preprocess.
    bpe_dir, data_bin = work / "bpe", work / "data-bin"
    if not pipeline.is_done(bpe_dir / "bpe.done"):
        log(f"joint BPE with {size['bpe_merges']} merges (subword-nmt)")
        bpe_dir.mkdir(parents=True, exist_ok=True)
        codes = bpe_dir / "codes"
        pipeline.learn_joint_bpe(text_dir / f"train.{src}", text_dir / f"train.{tgt}", size["bpe_merges"], codes, bpe_dir / "bpe.log")
        for split in pipeline.SPLITS:
            for lang in (src, tgt):
                pipeline.apply_bpe(codes, text_dir / f"{split}.{lang}", bpe_dir / f"{split}.{lang}", bpe_dir / "bpe.log")
        pipeline.mark_done(bpe_dir / "bpe.done")
    if not pipeline.is_done(data_bin / "preprocess.done"):
        log("binarising (fairseq-preprocess)")
        pipeline.binarize(bpe_dir, src, tgt, data_bin, work / "preprocess.log")
        pipeline.mark_done(data_bin / "preprocess.done")

    # 5. Training, one model per attention variant, all with the same size and budget.
    settings = TrainSettings(
        arch="adaptively_sparse_transformer", max_update=size["max_update"], max_tokens=size["max_tokens"],
        lr=2e-3, warmup_updates=size["warmup"], dropout=0.1, topk=size["topk"], keep_last_epochs=1,
        log_interval=max(1, size["max_update"] // 6),
        model_args=[
            "--encoder-layers", size["layers"], "--decoder-layers", size["layers"],
            "--encoder-embed-dim", size["dim"], "--decoder-embed-dim", size["dim"],
            "--encoder-ffn-embed-dim", size["ffn"], "--decoder-ffn-embed-dim", size["ffn"],
            "--encoder-attention-heads", size["heads"], "--decoder-attention-heads", size["heads"],
        ],
        extra_args=["--no-epoch-checkpoints"],
    )
    train_seconds, checkpoints = {}, {}
    for i, variant in enumerate(args.models, 1):
        log(f"model {i}/{len(args.models)}: {variant}")
        save_dir = work / "models" / variant
        train_seconds[variant] = pipeline.train(data_bin, save_dir, variant, settings, threads=args.threads)
        checkpoints[variant] = save_dir / "checkpoint_last.pt"

    # 6. Translation of the test set and scoring.
    references_tok = (text_dir / f"test.{tgt}").read_text(encoding="utf-8").splitlines()
    references_raw = files["test"][1].read_text(encoding="utf-8").splitlines()
    scores = {}
    for variant, checkpoint in checkpoints.items():
        hypotheses = pipeline.generate(data_bin, checkpoint, "test", work / "eval" / variant, label=variant,
                                       max_len=(1.5, 10))
        scores[variant] = pipeline.score(hypotheses, references_tok, references_raw, tgt, tokenized_bleu=own_corpus)

    # 7. Attention analysis: density and learned alphas for the table, figures on disk.
    analysis = pipeline.analyze(data_bin, checkpoints, "test", work / "analysis", work / "analysis.log")

    rows = []
    for variant in checkpoints:
        rows.append({"model": variant, **scores[variant], "train_seconds": train_seconds[variant],
                     **((analysis or {}).get(variant, {}))})
    table = pipeline.format_table(rows)
    signatures = (f"BLEU: {rows[0]['bleu_signature']}\nchrF: {rows[0]['chrf_signature']}")
    notes = (f"Test set: {counts['test']} sentences of {raw_dir} ({src}->{tgt}); density = mean fraction of "
             "keys with nonzero weight; alpha = per-head alpha (1 softmax, 1.5 entmax15, learned for alpha_entmax).")
    (work / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (work / "results.md").write_text(f"{table}\n\n{signatures}\n\n{notes}\n")
    print()
    print(table)
    print()
    print(signatures)
    print(notes)
    if analysis is not None:
        print(f"Figures and CSV tables: {work / 'analysis'}")
    print(f"Everything is in {work} (results.md, results.json); total time {pipeline.format_seconds(time.time() - started)}")


if __name__ == "__main__":
    sys.exit(main())
