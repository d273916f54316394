"""The plugin loads when fairseq loads the user dir, by either folder: the package's own (the
README's `--user-dir`, in a fresh process like the console scripts) and fairseq_entmax.USER_DIR
(which also works after fairseq_entmax was imported, as from Python before the hub); and
fairseq-entmax-analyze, which imports fairseq_entmax first, loads it whatever its --user-dir."""

import json
import os
import subprocess
import sys

import pytest

import fairseq_entmax
from helpers import fairseq_command, run

# Each case starts a Python that imports fairseq: seconds.
pytestmark = pytest.mark.slow

PACKAGE_FOLDER = os.path.dirname(fairseq_entmax.__file__)

CHECK = """
import sys
{before}
from argparse import Namespace
from fairseq import utils
from fairseq.models import ARCH_MODEL_REGISTRY
utils.import_user_module(Namespace(user_dir=sys.argv[1]))
from fairseq_entmax import repairs
print("explicit_sparse_transformer_wmt_en_de" in ARCH_MODEL_REGISTRY, all(r.installed for r in repairs.REPAIRS))
"""


@pytest.mark.parametrize(
    "before, user_dir",
    [
        ("", PACKAGE_FOLDER),
        ("", fairseq_entmax.USER_DIR),
        ("import fairseq_entmax.normalizers", fairseq_entmax.USER_DIR),
    ],
    ids=["package folder", "USER_DIR", "USER_DIR after importing the package"],
)
def test_loading_the_user_dir_registers_the_models_and_installs_the_repairs(before, user_dir):
    code = CHECK.format(before=before)
    proc = subprocess.run([sys.executable, "-c", code, user_dir], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["True", "True"]


@pytest.mark.parametrize(
    "user_dir",
    [[], ["--user-dir", PACKAGE_FOLDER], ["--user-dir", fairseq_entmax.USER_DIR]],
    ids=["no --user-dir", "package folder", "USER_DIR"],
)
def test_the_analysis_loads_a_checkpoint_by_every_route_to_the_plugin(user_dir, trained_model, tmp_path):
    """The README's fairseq-entmax-analyze command, which imports fairseq_entmax before it reads
    the checkpoint: the plugin (its models, the safe checkpoint loading) is loaded all the same."""
    model = trained_model("alpha_entmax")
    proc = run(
        [
            fairseq_command("fairseq-entmax-analyze"),
            model.data_bin,
            "--path",
            model.checkpoint,
            *user_dir,
            "--output-dir",
            tmp_path,
            "--cpu",
            "--no-figures",
            "--num-sentences",
            "5",
        ],
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    [analyzed] = json.loads((tmp_path / "analysis.json").read_text())["models"]
    # the model built from the checkpoint is this package's, with its learned alphas
    assert set(analyzed["normalizers"].values()) == {"alpha_entmax"}
    assert any(r["alpha"] != pytest.approx(1.5) for r in analyzed["alpha"])
