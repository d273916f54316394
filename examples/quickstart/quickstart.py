"""Quickstart (`make demo`): softmax, 1.5-entmax, learned alpha-entmax and top-k attention,
trained and compared end to end with fairseq on a toy language pair, on a CPU in minutes.

    .venv/bin/python -m examples.quickstart.quickstart                  # the toy pair, ~5 min on 2 cores
    .venv/bin/python -m examples.quickstart.quickstart --data DIR --src de --tgt en   # your corpus

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

from examples.pipeline.attention_analysis import analyze
from examples.pipeline.corpus import SPLITS, check_parallel_corpus, read_lines
from examples.pipeline.dataset import build_dataset
from examples.pipeline.evaluation import train_and_evaluate
from examples.pipeline.markers import is_done, mark_done
from examples.pipeline.tables import format_seconds, format_table
from examples.pipeline.tools import log, run_reporting_errors
from examples.pipeline.training import VARIANTS, TrainSettings
from examples.quickstart.toy_language import write_toy_corpus

REPO = Path(__file__).resolve().parents[2]

# Sizes chosen so the whole demo fits in 10 minutes on 2 CPU cores (measured: 4m50s) and
# every model reaches BLEU ~80 on the toy pair (docs/recipes.md); --tiny is the test
# suite's size.
SIZES = {
    "demo": {"n_train": 20000, "n_eval": 500, "bpe_merges": 300, "max_update": 200, "max_tokens": 4096,
             "warmup": 100, "layers": 2, "dim": 128, "ffn": 256, "heads": 4, "topk": 4},
    "tiny": {"n_train": 600, "n_eval": 40, "bpe_merges": 100, "max_update": 20, "max_tokens": 1024,
             "warmup": 10, "layers": 1, "dim": 32, "ffn": 64, "heads": 2, "topk": 2},
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="directory with your corpus: {train,valid,test}.{SRC,TGT}, "
                        "raw text, one sentence per line (default: the generated toy pair)")
    parser.add_argument("--src", help="source language code (file suffix), with --data")
    parser.add_argument("--tgt", help="target language code (file suffix), with --data")
    parser.add_argument("--work-dir", type=Path, help="where everything is written (default: runs/quickstart, or "
                        "runs/quickstart-<data folder name>-<src>-<tgt> for your corpus; -tiny added with --tiny)")
    parser.add_argument("--models", nargs="+", default=list(VARIANTS), choices=VARIANTS,
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
    return run_reporting_errors(run, parse_args(argv))


def run(args):
    size = dict(SIZES["tiny" if args.tiny else "demo"])
    if args.max_update:
        size["max_update"] = args.max_update
    if args.bpe_merges:
        size["bpe_merges"] = args.bpe_merges
    own_corpus = args.data is not None
    # One default folder per corpus, direction and size: a run never finds another's models.
    name = "quickstart" + (f"-{args.data.resolve().name}-{args.src}-{args.tgt}" if own_corpus else "")
    work = (args.work_dir or REPO / "runs" / (name + ("-tiny" if args.tiny else ""))).resolve()
    started = time.time()

    # 1. Corpus, checked before anything long starts.
    if own_corpus:
        raw_dir, src, tgt = args.data, args.src, args.tgt
    else:
        raw_dir = work / "raw"
        if not is_done(raw_dir / "corpus.done"):
            log(f"writing the toy corpus to {raw_dir}")
            n_eval = size["n_eval"]
            write_toy_corpus(raw_dir, n_train=size["n_train"], n_valid=n_eval, n_test=n_eval)
            mark_done(raw_dir / "corpus.done")
        src, tgt = "svo", "sov"
    files = {split: (raw_dir / f"{split}.{src}", raw_dir / f"{split}.{tgt}") for split in SPLITS}
    counts = check_parallel_corpus(files)
    log(f"corpus {raw_dir} {src}->{tgt}: " + ", ".join(f"{s} {n} lines" for s, n in counts.items()))
    work.mkdir(parents=True, exist_ok=True)

    # 2. Moses tokenisation (your corpus only: the toy pair is tokenised already), joint BPE,
    # fairseq-preprocess.
    text_dir, data_bin = build_dataset(raw_dir, src, tgt, work, size["bpe_merges"],
                                       tokenize=own_corpus, clean=None)

    # 3. Training, one model per attention variant, all with the same size and budget, then
    # translation of the test set and scoring.
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
    references_tok = read_lines(text_dir / f"test.{tgt}")
    references_raw = read_lines(files["test"][1])
    rows = []
    for i, variant in enumerate(args.models, 1):
        rows.append(train_and_evaluate(
            data_bin, work, variant, 1, settings, references_tok, references_raw, tgt,
            label=f"{variant} [{i}/{len(args.models)}]", max_len=(1.5, 10), tokenized_bleu=own_corpus,
            threads=args.threads))
    checkpoints = {row["model"]: row["checkpoint"] for row in rows}

    # 4. Attention analysis: density and learned alphas for the table, figures on disk.
    analysis = analyze(data_bin, checkpoints, "test", work / "analysis", work / "analysis.log")

    for row in rows:
        row.update((analysis or {}).get(row["model"], {}))
    table = format_table(rows, bleu_tok=own_corpus)
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
    print(f"Everything is in {work} (results.md, results.json); total time {format_seconds(time.time() - started)}")


if __name__ == "__main__":
    sys.exit(main())
