"""This package's normalizers against those of another commit, inside a trained model:
fairseq training steps and beam searches, side by side in one process.

A change to a normalizer can be faster on its own and not inside the model, where the
rest of the step shares the caches and the threads. This loads one checkpoint, and the
normalizers of the commit given by --against from git (fairseq_entmax/normalizers/ at that
commit, imported as a package of their own), then times the same training batches (forward
and backward with the model's criterion) and the same beam searches with each version,
in shuffled order batch by batch, so that a slower minute of the machine slows both alike.
Reported: the time of the working tree's version over the other's, in total and as the median
of the per-batch ratios. Timing the same version against itself gives the noise.

    python -m benchmarks.translation training --settings long-small --rounds 1 --models alpha_entmax \\
        --work-dir /tmp/ls
    python -m benchmarks.maps in-model /tmp/ls/long-small/bin \\
        --path /tmp/ls/long-small/alpha_entmax_r0/checkpoint_last.pt --against cbb67b9 --threads 2
"""

import argparse
import importlib.util
import itertools
import random
import statistics
import sys
import tempfile
from argparse import Namespace
from pathlib import Path

import torch
from fairseq import checkpoint_utils

from benchmarks.machine import run_record
from benchmarks.normalizers import CLOCKS, machine_description
from benchmarks.revisions import export
from fairseq_entmax.modules.sparse_multihead_attention import SparseMultiheadAttention
from fairseq_entmax.plugin import import_user_dir

NORMALIZERS = "fairseq_entmax/normalizers"
BASELINE_PACKAGE = "baseline_normalizers"


def load_baseline(revision, folder):
    """The normalizers of a git revision, imported as the package BASELINE_PACKAGE.

    Args: revision: a commit of this repository; folder: where the package's files are written.
    Returns: The package, whose functions are named as this tree's (FUNCTION_NAMES).
    """
    export(revision, NORMALIZERS, folder)
    package = Path(folder) / BASELINE_PACKAGE
    (Path(folder) / NORMALIZERS).rename(package)
    for file in package.glob("*.py"):
        file.write_text(file.read_text().replace("fairseq_entmax.normalizers", BASELINE_PACKAGE))
    # Imported from its folder by file location, the working tree's import path left as it is.
    spec = importlib.util.spec_from_file_location(
        BASELINE_PACKAGE, package / "__init__.py", submodule_search_locations=[str(package)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[BASELINE_PACKAGE] = module
    spec.loader.exec_module(module)
    return module


# The function each normalizer module calls, by the normalizer's name: the names every
# version of fairseq_entmax.normalizers exports.
FUNCTION_NAMES = {
    "softmax": "softmax",
    "sparsemax": "sparsemax",
    "entmax15": "entmax15",
    "alpha_entmax": "alpha_entmax",
    "topk": "topk_softmax",
}


def normalizer_modules(model):
    """The normalizer modules of the model's SparseMultiheadAttention."""
    return [module.normalizer for module in model.modules() if isinstance(module, SparseMultiheadAttention)]


def use(modules, functions):
    """Make each normalizer module call its function in `functions` (one per module)."""
    for module, function in zip(modules, functions):
        module.function = function


def time_side_by_side(versions, modules, batches, rounds, step, clock):
    """Seconds of `step(batch)` per version, batch by batch in shuffled version order.

    Args: versions: {name: the functions of the modules}; modules: the attention modules; batches: the
    batches, each run once per version per round; rounds: how many times every batch is run; step: the
    function timed; clock: a value of normalizers.CLOCKS.
    Returns: {name: [seconds, one per batch and round]}.
    """
    for name in versions:  # warm-up: first calls allocate
        use(modules, versions[name])
        step(batches[0])
    seconds = {name: [] for name in versions}
    for _ in range(rounds):
        for batch in batches:
            for name in random.sample(list(versions), len(versions)):
                use(modules, versions[name])
                start = clock()
                step(batch)
                seconds[name].append(clock() - start)
    return seconds


def ratios(seconds, baseline):
    """'total T, median of per-batch ratios M' of each version to `baseline`, a str per version."""
    lines = []
    for name, times in seconds.items():
        if name == baseline:
            continue
        per_batch = [mine / theirs for mine, theirs in zip(times, seconds[baseline])]
        lines.append(
            f"{name} / {baseline}: total {sum(times) / sum(seconds[baseline]):.3f}, median of "
            f"{len(per_batch)} per-batch ratios {statistics.median(per_batch):.3f} "
            f"({baseline}: {sum(seconds[baseline]):.1f} s)"
        )
    return lines


def build_parser():
    """The benchmark's command line (see the top), an argparse.ArgumentParser."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data_bin", type=Path, help="the data-bin, with train and test splits")
    parser.add_argument("--path", type=Path, required=True, help="a checkpoint of a model of this package")
    parser.add_argument("--against", required=True, help="the git commit whose normalizers are the baseline")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--train-batches", type=int, default=6, help="training batches of --max-tokens")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--gen-batches", type=int, default=3, help="test batches of 16 sentences translated")
    parser.add_argument("--gen-len", type=int, default=60, help="the output length every hypothesis is forced to")
    parser.add_argument("--rounds", type=int, default=3, help="times every batch is run per version")
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall time (default) or the process's CPU time, steadier on a shared machine at --threads 1",
    )
    return parser


def main():
    """The benchmark's command line (see the top); prints the ratios."""
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    random.seed(1)
    import_user_dir()  # the models and the safe checkpoint loading, before the checkpoint is read
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(args.path)], arg_overrides={"data": str(args.data_bin)}
    )
    model = models[0]
    modules = normalizer_modules(model)
    if not modules:
        sys.exit(f"{args.path} has no attention of this package: nothing to compare")
    with tempfile.TemporaryDirectory() as folder:
        baseline = load_baseline(args.against, folder)
        versions = {
            "working tree": [module.function for module in modules],
            args.against: [getattr(baseline, FUNCTION_NAMES[module.name]) for module in modules],
        }
        run_record(machine=machine_description(torch.device("cpu")))
        print(f"clock: {args.clock} time")
        print(f"normalizers: {sorted({module.name for module in modules})}")

        task.load_dataset("train")
        criterion = task.build_criterion(cfg.criterion)
        train_batches = task.get_batch_iterator(
            task.dataset("train"), max_tokens=args.max_tokens, seed=1, max_positions=(2048, 2048)
        ).next_epoch_itr(shuffle=True)
        train_batches = list(itertools.islice(train_batches, args.train_batches))
        if len(train_batches) < args.train_batches:
            sys.exit(f"--train-batches {args.train_batches}: the training set makes {len(train_batches)} batches")

        def train_step(batch):
            loss, _, _ = criterion(model, batch)
            loss.backward()
            model.zero_grad()

        model.train()
        seconds = time_side_by_side(versions, modules, train_batches, args.rounds, train_step, CLOCKS[args.clock])
        print("training step (forward + backward):", *ratios(seconds, args.against), sep="\n  ")

        task.load_dataset("test")
        generator = task.build_generator(
            [model], Namespace(beam=5, min_len=args.gen_len, max_len_a=0, max_len_b=args.gen_len)
        )
        # After the first batch, the shortest sources (fairseq batches by length).
        test_batches = task.get_batch_iterator(
            task.dataset("test"), max_sentences=16, max_positions=(2048, 2048)
        ).next_epoch_itr(shuffle=False)
        test_batches = list(itertools.islice(test_batches, args.gen_batches + 1))[1:]
        if len(test_batches) < args.gen_batches:
            sys.exit(
                f"--gen-batches {args.gen_batches}: the test set makes {len(test_batches)} batches of 16 sentences "
                "after the first, which is not timed"
            )

        def beam_search(batch):
            with torch.no_grad():
                task.inference_step(generator, [model], batch)

        model.eval()
        seconds = time_side_by_side(versions, modules, test_batches, args.rounds, beam_search, CLOCKS[args.clock])
        print(f"beam search (beam 5, {args.gen_len} tokens):", *ratios(seconds, args.against), sep="\n  ")
