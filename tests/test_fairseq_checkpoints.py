"""Checkpoints on torch >= 2.6 (weights_only=True stays on): fairseq's commands and hub
interface load ours. (A checkpoint carrying a payload that would run code is refused wherever
a checkpoint is read: test_checkpoint_refusal.py.) The sparse attention state carries a
version, so that a later change of what it stores still loads older checkpoints.

tests/data/alpha_entmax_checkpoint_v1.pt is a checkpoint of version 1 (alpha_logit on the
attention module), trained by the code of that layout (commit e0ae22d) as conftest's
trained_model("alpha_entmax") trains, on its tiny corpus, its optimizer state removed;
alpha_entmax_checkpoint_v1.generate.txt is what that code's fairseq-generate printed for it
(beam 5, the test split)."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import USER_DIR, run_on_checkpoint

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

VERSION_1_CHECKPOINT = Path(__file__).parent / "data" / "alpha_entmax_checkpoint_v1.pt"
ALPHA_SUFFIX = "normalizer.alpha_logit"
# The relative tolerance of a recorded beam score: another CPU sums the float32 log-probabilities
# in another order (its SIMD width), which moves a score by a few units of the 7th digit
# (2e-7 relative seen); 1e-5 leaves room for that and still fails on any change of the model or
# its normalizers, which moves scores by 1e-3 or more.
SCORE_TOLERANCE = 1e-5


def test_checkpoint_saved_under_numpy_1_loads(trained_model, tmp_path):
    """numpy 1 pickles an array through numpy.core.multiarray._reconstruct, numpy 2 through
    numpy._core: a model trained with --eval-bleu under numpy 1 holds the former."""
    model = trained_model("softmax")
    state = torch.load(model.checkpoint, weights_only=True)
    state["extra_state"]["metrics"] = {"valid": {"_bleu_counts_0": np.array([7, 5, 3, 1])}}
    saved = tmp_path / "numpy2.pt"
    torch.save(state, saved)
    numpy1 = tmp_path / "checkpoint_numpy1.pt"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(numpy1, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("data.pkl"):
                assert b"numpy._core.multiarray" in data
                data = data.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            target.writestr(item, data)

    proc = run_on_checkpoint("fairseq-generate", model.data_bin, numpy1, "--cpu", "--beam", "2")
    assert "Translated 40 sentences" in proc.stdout + proc.stderr


def test_hub_interface_translates_with_our_user_dir(trained_model, tiny_data):
    model = trained_model("alpha_entmax")
    source = (tiny_data.raw_dir / "test.src").read_text().splitlines()[0]
    code = (
        "import sys\n"
        "from fairseq.models.transformer import TransformerModel\n"
        "hub = TransformerModel.from_pretrained(sys.argv[1], checkpoint_file='checkpoint_last.pt',\n"
        "    data_name_or_path=sys.argv[2], user_dir=sys.argv[3], beam=4)\n"
        "print(type(hub.models[0]).__name__)\n"
        "print(hub.translate(sys.argv[4]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(model.save_dir), str(model.data_bin), USER_DIR, source],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    class_name, translation = proc.stdout.strip().splitlines()[-2:]
    assert class_name == "AdaptivelySparseTransformerModel"
    words = translation.split()
    assert words and all(w.startswith("t") and w[1:].isdigit() for w in words)


def _alpha_keys(state_dict):
    return sorted(key for key in state_dict if key.endswith(".alpha_logit"))


def _load(checkpoint, data_bin):
    from fairseq import checkpoint_utils

    (model,), _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [str(checkpoint)], arg_overrides={"data": str(data_bin)}
    )
    return model


def _as_version_1(state_dict, with_version_key=True):
    """A state dict of the current layout rewritten as version 1 stored it: alpha_logit on the
    attention module, with the version key 1 (or, before the key existed, without it)."""
    from fairseq_entmax.modules.sparse_multihead_attention import STATE_VERSION_KEY

    old = {}
    for key, value in state_dict.items():
        if key.endswith(ALPHA_SUFFIX):
            old[key[: -len(ALPHA_SUFFIX)] + "alpha_logit"] = value
        elif key.endswith(STATE_VERSION_KEY):
            if with_version_key:
                old[key] = torch.tensor([1])
        else:
            old[key] = value
    return old


def test_fairseq_train_writes_the_version_of_the_sparse_attention_state(trained_model):
    """Every module with a learned alpha stores its state's version next to its normalizer's
    alpha_logit; modules without one store exactly what fairseq's MultiheadAttention stores."""
    from fairseq_entmax.modules.sparse_multihead_attention import STATE_VERSION, STATE_VERSION_KEY

    state = torch.load(trained_model("alpha_entmax").checkpoint, weights_only=True)["model"]
    alpha_keys = _alpha_keys(state)
    assert len(alpha_keys) == 6  # 2 encoder self, 2 decoder self, 2 cross
    for key in alpha_keys:
        assert key.endswith(ALPHA_SUFFIX), key
        version_key = key[: -len(ALPHA_SUFFIX)] + STATE_VERSION_KEY
        assert state[version_key].tolist() == [STATE_VERSION] == [2], version_key
    softmax_state = torch.load(trained_model("softmax").checkpoint, weights_only=True)["model"]
    assert not any(STATE_VERSION_KEY in key or "alpha_logit" in key for key in softmax_state)


@pytest.mark.parametrize("with_version_key", [True, False], ids=["version 1", "before the version key"])
def test_a_version_1_state_dict_loads_its_alphas_into_the_normalizers(trained_model, tmp_path, with_version_key):
    """Checkpoints of version 1 hold alpha_logit on the attention module, with the version key
    1 or (written before the key existed) without it: they load with their alphas, and the
    loaded model writes the current layout."""
    from fairseq_entmax.modules.sparse_multihead_attention import STATE_VERSION_KEY

    model = trained_model("alpha_entmax")
    state = torch.load(model.checkpoint, weights_only=True)
    current = state["model"]
    state["model"] = _as_version_1(current, with_version_key)
    old = tmp_path / "checkpoint_version_1.pt"
    torch.save(state, old)

    written = _load(old, model.data_bin).state_dict()
    assert _alpha_keys(written) == _alpha_keys(current)
    for key in _alpha_keys(current):
        assert torch.equal(written[key], current[key]), key
        assert written[key[: -len(ALPHA_SUFFIX)] + STATE_VERSION_KEY].tolist() == [2], key


def test_a_checkpoint_trained_by_the_version_1_code_translates_as_it_did(tiny_data, tmp_path):
    """fairseq-generate on the checkpoint that the version 1 code trained prints the same
    translations, with the same scores (to SCORE_TOLERANCE), as that code did."""
    proc = run_on_checkpoint(
        "fairseq-generate",
        tiny_data.data_bin,
        VERSION_1_CHECKPOINT,
        "--gen-subset",
        "test",
        "--beam",
        "5",
        "--cpu",
        "--batch-size",
        "16",
    )
    printed = [line for line in proc.stdout.splitlines() if line.startswith(("H-", "S-"))]
    expected = VERSION_1_CHECKPOINT.with_suffix(".generate.txt").read_text().splitlines()
    assert len(expected) == 80 and len(printed) == len(expected)
    for line, recorded in zip(printed, expected):
        (kind, *fields), (recorded_kind, *recorded_fields) = line.split("\t"), recorded.split("\t")
        # Sources and hypotheses token for token; a hypothesis' score within SCORE_TOLERANCE.
        assert (kind, fields[-1]) == (recorded_kind, recorded_fields[-1]), (line, recorded)
        if kind.startswith("H-"):
            assert float(fields[0]) == pytest.approx(float(recorded_fields[0]), rel=SCORE_TOLERANCE), (line, recorded)

    loaded = _load(VERSION_1_CHECKPOINT, tiny_data.data_bin)
    stored = torch.load(VERSION_1_CHECKPOINT, weights_only=True)["model"]
    for key, value in stored.items():
        if key.endswith(".alpha_logit"):
            assert torch.equal(loaded.state_dict()[key[: -len("alpha_logit")] + ALPHA_SUFFIX], value), key


def test_an_old_version_goes_through_the_upgrades_and_a_newer_one_is_refused(trained_model, tmp_path, monkeypatch):
    """The path a later change of storage takes: with STATE_VERSION 3, a version 2 checkpoint
    passes through the upgrade registered under 2, once per module with a learned alpha."""
    from fairseq_entmax.modules import sparse_multihead_attention as attention_module

    model = trained_model("alpha_entmax")
    upgraded = []
    monkeypatch.setattr(attention_module, "STATE_VERSION", 3)
    monkeypatch.setattr(attention_module, "_STATE_UPGRADES", {2: lambda state_dict, prefix: upgraded.append(prefix)})
    _load(model.checkpoint, model.data_bin)
    assert sorted(upgraded) == sorted(
        key[: -len(ALPHA_SUFFIX)] for key in _alpha_keys(torch.load(model.checkpoint, weights_only=True)["model"])
    )

    monkeypatch.undo()
    state = torch.load(model.checkpoint, weights_only=True)
    for key in list(state["model"]):
        if key.endswith(attention_module.STATE_VERSION_KEY):
            state["model"][key] = torch.tensor([3])
    newer = tmp_path / "checkpoint_newer.pt"
    torch.save(state, newer)
    with pytest.raises(ValueError, match="saved by a newer fairseq-entmax"):
        _load(newer, model.data_bin)
