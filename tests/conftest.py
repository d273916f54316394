"""Session fixtures shared by the test files: a tiny corpus and tiny models trained once per
normalizer through the real fairseq-train, reused by every test that needs a checkpoint.

Fixtures for other test files:
- `tiny_data`: TinyData(raw_dir, data_bin) from helpers.write_tiny_corpus + preprocess
  (source language "src", target "tgt", joined dictionary).
- `trained_model`: a factory, `trained_model(normalizer)` -> TrainedModel(checkpoint,
  data_bin, save_dir, train_log, normalizer), trained once per session and normalizer.
- `tiny_model_args`: the fairseq-train arguments of those models (architecture and sizes),
  for tests that train a variant themselves.
"""

import os
from collections import namedtuple

import pytest

from helpers import TINY_MODEL_ARGS, TRAINING_ARGS, preprocess, train_tiny, write_tiny_corpus

# Tests marked `slow` (deselected by `make test-fast`, i.e. `pytest -m "not slow"`): every test
# that needs the session corpus or models below, directly or through a fixture of its own; every
# test of the modules that train or run commands without them (fairseq-train and the other
# fairseq commands, recipes, the quickstart, the reproduction, torch.compile); and the few other
# tests that take seconds each (all their parameters; most of the fast suite's time).
SLOW_FIXTURES = {"tiny_data", "tiny_model_args", "trained_model"}
SLOW_MODULE_PREFIXES = ("test_fairseq_",)
SLOW_MODULES = {
    "test_checkpoint_refusal",
    "test_evaluation_batches",
    "test_long_inputs",
    "test_normalizers_compile",
    "test_quickstart",
    "test_recipes",
    "test_reproduction",
}
SLOW_TESTS = {
    "test_attention_layer_edges::test_incremental_beam_decoding_equals_the_full_forward",
    "test_normalizers_api::test_first_alpha_entmax_call_imports_nothing_heavy",  # a fresh Python imports torch
    "test_normalizers_entmax_package::test_float32_attention_rows_agree_with_float64_reference",
    "test_normalizers_sync_free::test_fixed_passes_reach_documented_accuracy_on_adversarial_rows",
    "test_normalizers_sync_free::test_sorted_thresholds_reach_documented_accuracy_on_adversarial_rows",
}


# Under pytest-xdist (make test runs it with --dist loadgroup), the tests of each of these
# modules go to one worker, which then runs their module-scoped fixture (a recipe, quickstart
# or training run of up to minutes) once; every other test is scheduled on its own.
MODULES_WITH_SHARED_FIXTURES = {
    "test_analysis_models",
    "test_analysis_training_log",
    "test_attention_layer_edges",
    "test_evaluation_batches",
    "test_fairseq_finetune",
    "test_fairseq_interactive_hub",
    "test_fairseq_option_wiring",
    "test_fairseq_outputs",
    "test_long_inputs",
    "test_quickstart",
    "test_recipes",
    "test_reproduction",
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = item.path.stem
        name = f"{module}::{getattr(item, 'originalname', item.name)}"
        if (
            SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            or module in SLOW_MODULES
            or module.startswith(SLOW_MODULE_PREFIXES)
            or name in SLOW_TESTS
        ):
            item.add_marker(pytest.mark.slow)
        fixture_defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        if module not in MODULES_WITH_SHARED_FIXTURES and any(
            defs[-1].scope == "module" for defs in fixture_defs.values()
        ):
            raise pytest.UsageError(
                f"{item.nodeid} uses a module-scoped fixture: add {module} to conftest's "
                "MODULES_WITH_SHARED_FIXTURES, so that pytest-xdist runs it once"
            )


def pytest_xdist_make_scheduler(config, log):
    """With --dist loadgroup, the scheduling of MODULES_WITH_SHARED_FIXTURES above.

    xdist's own loadgroup takes its groups from a suffix that its xdist_group mark appends to
    the node id, which pytest 9.2 ignores (Node.nodeid is no longer read from _nodeid): every
    test was scheduled alone and the recipe and reproduction runs were made on both workers.
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureModules(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            path = nodeid.split("::", 1)[0]
            return path if os.path.splitext(os.path.basename(path))[0] in MODULES_WITH_SHARED_FIXTURES else nodeid

    return SharedFixtureModules(config, log)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "requires(available, reason): needs something a machine may lack (../shared/data, the entmax "
        "package): skipped without it, failed without it when CI is set",
    )


def pytest_runtest_setup(item):
    """A missing requirement skips a test on a developer's machine; under CI (CI set) it fails
    it, since there it means a broken set-up that a skip would turn green."""
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
def tiny_data(tmp_path_factory):
    """The tiny corpus, raw and binarized (fairseq-preprocess), made once per session."""
    root = tmp_path_factory.mktemp("tiny_data")
    raw = write_tiny_corpus(root / "raw")
    return TinyData(raw, preprocess(raw, root / "data-bin"))


@pytest.fixture(scope="session")
def tiny_model_args():
    """fairseq-train arguments of the tiny models (architecture, sizes and training)."""
    return TINY_MODEL_ARGS + TRAINING_ARGS


@pytest.fixture(scope="session")
def trained_model(tiny_data, tmp_path_factory):
    """Factory: `trained_model(normalizer)` trains a tiny adaptively_sparse_transformer with
    `--attention-normalizer normalizer` in all attention (one of "softmax", "sparsemax",
    "entmax15", "alpha_entmax" (learned alpha), "topk" (k = 3)) for 200 updates through
    fairseq-train --user-dir fairseq_entmax, once per session, and returns
    TrainedModel(checkpoint=path of checkpoint_last.pt, data_bin, save_dir,
    train_log=fairseq-train's output (json log lines), normalizer).
    """
    trained = {}

    def train(normalizer):
        if normalizer not in trained:
            save_dir = tmp_path_factory.mktemp(f"trained_{normalizer}")
            proc = train_tiny(
                tiny_data.data_bin,
                save_dir,
                "--attention-normalizer",
                normalizer,
                *NORMALIZER_ARGS.get(normalizer, []),
                "--max-update",
                str(TINY_MAX_UPDATE),
            )
            trained[normalizer] = TrainedModel(
                save_dir / "checkpoint_last.pt",
                tiny_data.data_bin,
                save_dir,
                proc.log,
                normalizer,
            )
        return trained[normalizer]

    return train
