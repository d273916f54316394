"""Checkpoints on torch >= 2.6 (weights_only=True stays on): fairseq's commands and hub
interface load ours. (A checkpoint carrying a payload that would run code is refused wherever
a checkpoint is read: test_checkpoint_refusal.py.)"""
import os
import subprocess
import sys
import zipfile

import numpy as np
import torch

from helpers import USER_DIR, fairseq_command, run


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

    proc = run([
        fairseq_command("fairseq-generate"), model.data_bin, "--path", numpy1,
        "--user-dir", USER_DIR, "--cpu", "--beam", "2",
    ])
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
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    class_name, translation = proc.stdout.strip().splitlines()[-2:]
    assert class_name == "AdaptivelySparseTransformerModel"
    words = translation.split()
    assert words and all(w.startswith("t") and w[1:].isdigit() for w in words)
