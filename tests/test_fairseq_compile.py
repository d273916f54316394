"""--compile-normalizers through the real commands: fairseq-train and fairseq-generate run the
attention normalizers through torch.compile, without a recompilation per batch shape, and
translate as the eager model does."""

import re

import pytest

from conftest import TINY_MODEL_ARGS, TRAINING_ARGS
from helpers import USER_DIR, fairseq_command, run, run_on_checkpoint

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = pytest.mark.slow

# Shapes change at every batch; dynamic shapes keep one graph for them. A few recompilations
# remain, each once: no gradient (validation, generation), a query length of 1 (incremental
# decoding), a layout fairseq gives only there.
MAX_RECOMPILATIONS = 4


def recompilations(log):
    return len(re.findall(r"Recompiling function", log))


def hypotheses(log):
    """{sentence id: hypothesis tokens} from fairseq-generate's H- lines."""
    found = re.findall(r"^H-(\d+)\t\S+\t(.*)$", log, flags=re.MULTILINE)
    return {int(index): tokens for index, tokens in found}


def test_train_and_generate_with_compiled_normalizers(tiny_data, tmp_path):
    env = {"TORCH_LOGS": "recompiles"}  # torch prints each recompilation and its reason
    trained = run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *TINY_MODEL_ARGS,
            *TRAINING_ARGS,
            "--attention-normalizer",
            "entmax15",
            "--compile-normalizers",
            "--max-update",
            "8",
            "--save-dir",
            tmp_path,
        ],
        env=env,
    )
    train_log = trained.stdout + trained.stderr
    assert "compiled" in train_log, "the model summary does not show compiled normalizers"
    assert 'num_updates": "8"' in train_log, "training did not reach 8 updates"
    assert recompilations(train_log) <= MAX_RECOMPILATIONS, train_log[-3000:]

    checkpoint = tmp_path / "checkpoint_last.pt"
    generate = ("fairseq-generate", tiny_data.data_bin, checkpoint, "--beam", "3", "--cpu", "--gen-subset", "test")
    compiled = run_on_checkpoint(*generate, env=env)
    eager = run_on_checkpoint(*generate, "--model-overrides", "{'compile_normalizers': False}")
    compiled_log = compiled.stdout + compiled.stderr
    assert recompilations(compiled_log) <= MAX_RECOMPILATIONS, compiled_log[-3000:]
    assert "compiled" in compiled_log and "compiled" not in eager.stdout + eager.stderr
    translated = hypotheses(compiled.stdout)
    assert len(translated) == 40 and translated == hypotheses(eager.stdout)
