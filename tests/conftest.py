"""Session fixtures shared by the test files: a tiny corpus and tiny models trained once per
normalizer through the real fairseq-train, reused by every test that needs a checkpoint.

Fixtures for other test files:
- `tiny_data`: TinyData(raw_dir, data_bin) from helpers.write_tiny_corpus + preprocess
  (source language "src", target "tgt", joined dictionary).
- `trained_model`: a factory, `trained_model(normalizer)` -> TrainedModel(checkpoint,
  data_bin, save_dir, train_log, normalizer), trained once per test run and normalizer
  (pytest-xdist's workers share them).
- `tiny_model_args`: the fairseq-train arguments of those models (architecture and sizes),
  for tests that train a normalizer themselves.
- `fairseq_plugin`: fairseq in this process with the plugin loaded, as `--user-dir` leaves it,
  for the tests that load checkpoints, build models or generate in-process. Only they request
  it, so that the torch-only tests run where fairseq is not installed
  (tests/test_suite_without_fairseq.py).

And two markers (declared in pyproject.toml, like `slow`): `cuda`, a test that skips without a
CUDA device, and `requires(available, reason)`, a test that needs what a machine may lack:
it skips without it, and fails without it under CI.
"""

import os
import shutil
from collections import namedtuple

import pytest
from filelock import FileLock

from helpers import TINY_MODEL_ARGS, TRAINING_ARGS, preprocess, train_tiny, write_tiny_corpus


def pytest_configure(config):
    """Under pytest-xdist each worker gets its share of the cores, for its own torch and for the
    commands it starts (they inherit OMP_NUM_THREADS): with torch's default, every worker's pool
    would take every core, and the oversubscribed threads slow each other down."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        import torch

        threads = max(1, (os.cpu_count() or 1) // int(workers))
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, str(threads))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The files that take longest, longest first (`pytest --durations=0`, summed by file). Under
# `make test` (--dist loadfile --no-loadscope-reorder) pytest-xdist hands the files out in
# collection order, each worker taking the next when it is nearly done: started first, a long
# file does not keep one worker busy at the end while the other waits.
LONGEST_FILES = (
    "test_doc_commands.py",
    "test_recipes.py",
    "test_reproduction.py",
    "test_huggingface_compile.py",
    "test_quickstart.py",
    "test_attention_benchmark.py",
    "test_checkpoint_refusal.py",
    "test_fairseq_compile.py",
)


def pytest_collection_modifyitems(config, items):
    """The tests of LONGEST_FILES first, in its order; the others keep theirs."""
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_runtest_setup(item):
    """A `cuda` test skips without a CUDA device (CI has none). A missing requirement skips a
    test on a developer's machine; under CI (CI set) it fails it, since there it means a broken
    set-up that a skip would turn green."""
    if item.get_closest_marker("cuda"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device (make gpu-check runs it on a GPU machine)")
    for marker in item.iter_markers("requires"):
        available, reason = marker.args
        if not available:
            if os.environ.get("CI"):
                pytest.fail(
                    f"CI is set, and {reason}: install or provide it (a skip would hide a broken set-up)", pytrace=False
                )
            pytest.skip(reason)


TinyData = namedtuple("TinyData", "raw_dir data_bin")
TrainedModel = namedtuple("TrainedModel", "checkpoint data_bin save_dir train_log normalizer")

# Updates of the session models (helpers.TINY_MODEL_ARGS and TRAINING_ARGS say the rest).
TINY_MAX_UPDATE = 200
# top-k keeps 3 keys: with the corpus' 3-10 token sentences the default k = 8 would rarely
# drop any key.
NORMALIZER_ARGS = {"topk": ["--topk", "3"]}


@pytest.fixture(scope="session")
def fairseq_plugin():
    """fairseq with the plugin loaded (models registered, repairs installed) in this process.

    Returns:
        The fairseq_entmax.plugin module. The fairseq commands the tests run load it themselves.
    """
    from fairseq_entmax import plugin

    return plugin


def _made_once(tmp_path_factory, name, make):
    """A directory made once per test run, shared by pytest-xdist's workers: the first to ask
    runs `make(directory)` while the others wait on its lock, so a fixture's fairseq commands
    (seconds each) do not run again on every worker.

    Args:
        tmp_path_factory: pytest's, for the run's temporary root.
        name: the directory's name there.
        make: function(directory) -> str, the text kept beside what it made.

    Returns:
        (directory, the text `make` returned).
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's root, above each worker's own
    directory, made = root / name, root / f"{name}.made"
    with FileLock(root / f"{name}.lock"):
        if not made.exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            made.write_text(make(directory), encoding="utf-8")
    return directory, made.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The tiny corpus, raw and binarized (fairseq-preprocess), made once per test run."""

    def make(root):
        # The console script as a process of its own: the suite's run of it as users run it.
        preprocess(write_tiny_corpus(root / "raw"), root / "data-bin", process=True)
        return ""

    root, _ = _made_once(tmp_path_factory, "tiny_data", make)
    return TinyData(root / "raw", root / "data-bin")


@pytest.fixture(scope="session")
def tiny_model_args():
    """fairseq-train arguments of the tiny models (architecture, sizes and training)."""
    return TINY_MODEL_ARGS + TRAINING_ARGS


@pytest.fixture(scope="session")
def trained_model(tiny_data, tmp_path_factory):
    """Factory: `trained_model(normalizer)` trains a tiny adaptively_sparse_transformer with
    `--attention-normalizer normalizer` in all attention (one of "softmax", "sparsemax",
    "entmax15", "alpha_entmax" (learned alpha), "topk" (k = 3)) for 200 updates through
    fairseq-train --user-dir fairseq_entmax, once per test run, and returns
    TrainedModel(checkpoint=path of checkpoint_last.pt, data_bin, save_dir,
    train_log=fairseq-train's output (json log lines), normalizer).
    """
    trained = {}

    def train(normalizer):
        if normalizer not in trained:

            def make(save_dir):
                return train_tiny(
                    tiny_data.data_bin,
                    save_dir,
                    "--attention-normalizer",
                    normalizer,
                    *NORMALIZER_ARGS.get(normalizer, []),
                    "--max-update",
                    str(TINY_MAX_UPDATE),
                ).log

            save_dir, log = _made_once(tmp_path_factory, f"trained_{normalizer}", make)
            trained[normalizer] = TrainedModel(
                save_dir / "checkpoint_last.pt", tiny_data.data_bin, save_dir, log, normalizer
            )
        return trained[normalizer]

    return train
