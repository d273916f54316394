"""Recipes for the translation experiments of Correia et al. (2019), Table 1, with fairseq:
softmax, 1.5-entmax, learned alpha-entmax and top-k (k = 8) attention in Transformer base.

    .venv/bin/python examples/translation/recipe.py iwslt17              # IWSLT17 de-en, downloads
    .venv/bin/python examples/translation/recipe.py kftt --raw-dir DIR   # KFTT ja-en from your files
    .venv/bin/python examples/translation/recipe.py wmt16 --smoke        # tiny end-to-end check
    .venv/bin/python examples/translation/recipe.py wmt14 --models alpha_entmax --seed 2

Stages (each skipped when finished; training resumes from checkpoint_last.pt):
  prepare   official data -> plain text train/valid/test.{src,tgt} (download, or --raw-dir DIR
            holding those six files, or in --smoke mode real text from ../shared/data)
  tokenize  Moses tokenisation with sacremoses (Japanese: split into characters first)
  bpe       joint BPE, 32k merges (subword-nmt); training pairs cleaned as clean-corpus-n.perl
  binarize  fairseq-preprocess with a joined dictionary
  train     fairseq-train per attention variant: Transformer base, 8192-token batches, Adam,
            4000 warm-up updates then inverse square root
  average   average of the last 5 checkpoints
  evaluate  fairseq-generate (beam 5) on test; tokenized BLEU as in the paper, sacreBLEU and chrF
  analyze   fairseq-entmax-analyze on test: attention density, learned alphas, figures
"""
import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]
REPO = EXAMPLES.parent
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from entmax_recipes import pipeline  # noqa: E402
from entmax_recipes.pipeline import log  # noqa: E402
from tasks import SMOKE_BPE_MERGES, SMOKE_TRAIN, TASKS, download, write_smoke_data  # noqa: E402

DEFAULT_SHARED_DATA = REPO.parent / "shared" / "data"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("task", choices=sorted(TASKS), help="the paper's task")
    parser.add_argument("--src", help="source language (default: the paper's direction)")
    parser.add_argument("--tgt", help="target language")
    parser.add_argument("--smoke", action="store_true",
                        help="every stage at tiny scale on real text from ../shared/data (minutes on a CPU)")
    parser.add_argument("--raw-dir", type=Path, help="read plain text {train,valid,test}.{src,tgt} from here "
                        "instead of downloading the official data")
    parser.add_argument("--shared-data", type=Path, default=DEFAULT_SHARED_DATA,
                        help="the project's shared data folder, for --smoke (default: %(default)s)")
    parser.add_argument("--work-dir", type=Path, help="where everything goes (default: runs/<task>-<src>-<tgt>[-smoke])")
    parser.add_argument("--models", nargs="+", default=list(pipeline.VARIANTS), choices=pipeline.VARIANTS,
                        help="attention variants (default: all four)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-update", type=int, help="training updates (default: per task)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch per device (default: 8192); with "
                        "--update-freq N, the batch is N times larger")
    parser.add_argument("--update-freq", type=int, help="accumulate gradients over N batches")
    parser.add_argument("--workers", type=int, default=1, help="processes for tokenisation, BPE and binarisation")
    parser.add_argument("--analysis-sentences", type=int,
                        help="test sentences the attention analysis runs over (default: 500, 100 with --smoke)")
    parser.add_argument("--skip-analysis", action="store_true", help="no fairseq-entmax-analyze stage")
    args = parser.parse_args(argv)
    task = TASKS[args.task]
    if bool(args.src) != bool(args.tgt):
        parser.error("give both --src and --tgt, or neither (the paper's direction)")
    pair = (args.src, args.tgt) if args.src else task.pairs[0]
    if pair not in task.pairs:
        supported = ", ".join(f"--src {s} --tgt {t}" for s, t in task.pairs)
        parser.error(f"unknown language pair {pair[0]}-{pair[1]} for {task.title}: use {supported}")
    if args.smoke and args.raw_dir:
        parser.error("--smoke reads ../shared/data; --raw-dir is for full runs: give one of them")
    args.src, args.tgt = pair
    return args


def main(argv=None):
    return pipeline.run_reporting_errors(run, parse_args(argv))


def run(args):
    task, src, tgt = TASKS[args.task], args.src, args.tgt
    overrides = {name: getattr(args, name) for name in ("max_update", "max_tokens", "update_freq") if getattr(args, name)}
    settings = dataclasses.replace(SMOKE_TRAIN if args.smoke else task.train, **overrides)
    bpe_merges = SMOKE_BPE_MERGES if args.smoke else task.bpe_merges
    work = (args.work_dir or REPO / "runs" / f"{task.name}-{src}-{tgt}{'-smoke' if args.smoke else ''}").resolve()
    started = time.time()
    log(f"{task.title}, {src}->{tgt}{' (smoke mode)' if args.smoke else ''}; work dir {work}")

    # prepare: plain, line-aligned text, checked before anything long starts.
    raw_dir = args.raw_dir if args.raw_dir else work / "raw"
    # A corpus prepared from other data is refused, not reused.
    prepared_from = ({"smoke": str(Path(args.shared_data).resolve()), "pair": [src, tgt]} if args.smoke
                     else {"downloads": task.name, "pair": [src, tgt]})
    if not args.raw_dir and not pipeline.done_with(raw_dir / "prepare.done", prepared_from, "the prepared corpus"):
        if args.smoke:
            log(f"prepare: {task.smoke.note}")
            write_smoke_data(task, args.shared_data, src, tgt, raw_dir)
        else:
            downloads = work / "downloads"
            for url, name in task.downloads:
                download(url, downloads / name)
            log("prepare: extracting plain text")
            raw_dir.mkdir(parents=True, exist_ok=True)
            task.prepare(downloads, raw_dir, src, tgt)
        pipeline.check_parallel_corpus({s: (raw_dir / f"{s}.{src}", raw_dir / f"{s}.{tgt}") for s in pipeline.SPLITS})
        pipeline.mark_done(raw_dir / "prepare.done", settings=prepared_from)
    counts = pipeline.check_parallel_corpus({s: (raw_dir / f"{s}.{src}", raw_dir / f"{s}.{tgt}") for s in pipeline.SPLITS})
    log("corpus: " + ", ".join(f"{s} {n} pairs" for s, n in counts.items()))

    clean = (task.clean_max_len, task.clean_max_ratio)
    text_dir, data_bin = pipeline.build_dataset(raw_dir, src, tgt, work, bpe_merges, clean=clean, workers=args.workers)

    # train, average, evaluate
    references_tok = pipeline.read_lines(text_dir / f"test.{tgt}")
    references_raw = pipeline.read_lines(raw_dir / f"test.{tgt}")
    rows = []
    for i, variant in enumerate(args.models, 1):
        rows.append(pipeline.train_and_evaluate(
            data_bin, work, variant, args.seed, settings, references_tok, references_raw, tgt,
            label=f"{variant} [{i}/{len(args.models)}]", average_last=settings.keep_last_epochs,
            beam=task.beam, lenpen=task.lenpen, max_len=(1.2, 10) if args.smoke else None))
    checkpoints = {row["model"]: row["checkpoint"] for row in rows}

    # analyze
    if not args.skip_analysis:
        analysis = pipeline.analyze(data_bin, checkpoints, "test", work / f"analysis-seed{args.seed}",
                                    work / f"analysis-seed{args.seed}.log",
                                    num_sentences=args.analysis_sentences or (100 if args.smoke else 500))
        for row in rows:
            row.update((analysis or {}).get(row["model"], {}))

    table = pipeline.format_table(rows, bleu_tok=True)
    lines = [f"{task.title} {src}->{tgt}{' (smoke mode: ' + task.smoke.note + ')' if args.smoke else ''}",
             f"test: {counts['test']} sentences; data: {task.data_notes if not args.smoke else task.smoke.note}",
             "", table, "",
             f"tok BLEU: {rows[0]['bleu_tok_signature']} on Moses-tokenised text (multi-bleu.perl)",
             f"BLEU: {rows[0]['bleu_signature']}", f"chrF: {rows[0]['chrf_signature']}"]
    if not args.smoke and (src, tgt) == task.pairs[0]:
        lines.append("paper (tokenized BLEU): " + ", ".join(f"{k} {v}" for k, v in task.paper_bleu.items()))
    report = "\n".join(lines)
    (work / f"results-seed{args.seed}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (work / f"results-seed{args.seed}.md").write_text(report + "\n")
    print()
    print(report)
    print(f"\nresults: {work / f'results-seed{args.seed}.md'}; total time {pipeline.format_seconds(time.time() - started)}")


if __name__ == "__main__":
    sys.exit(main())
