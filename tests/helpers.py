"""Shared helpers for tests that go through the real fairseq commands.

The tests run fairseq's console scripts (fairseq-preprocess, fairseq-train, ...) from the
same virtual environment as pytest, with `--user-dir` pointing at the package, as a user would.
"""

import os
import random
import re
import subprocess
import sys
from pathlib import Path

from fairseq_entmax import USER_DIR  # the tests import it from here too

BIN_DIR = Path(sys.executable).parent


def fairseq_command(name):
    """Path of a fairseq console script (fairseq-train, ...) installed beside this Python."""
    path = BIN_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run `make setup` first")
    return str(path)


def run(args, check=True, timeout=600, cwd=None, env=None, input=None):
    """Run a command, capturing its output; on failure the error shows the command and its output."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    full_env.update(env or {})
    proc = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=full_env,
        input=input,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"command failed ({proc.returncode}): {' '.join(map(str, args))}\n"
            f"--- stdout ---\n{proc.stdout[-5000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"
        )
    return proc


def run_on_model(command, model, *arguments, **run_options):
    """Run a fairseq command that loads a trained model, as a user types it.

    Args:
        command: the console script, e.g. "fairseq-generate", "fairseq-interactive".
        model: what conftest's `trained_model` returns (its data_bin and checkpoint are used).
        *arguments: the command's other arguments, after `DATA-BIN --user-dir ... --path ...`.
        **run_options: passed to run (input, check, ...).

    Returns:
        The finished process (subprocess.CompletedProcess), as run returns it.
    """
    return run(
        [fairseq_command(command), model.data_bin, "--user-dir", USER_DIR, "--path", model.checkpoint, *arguments],
        **run_options,
    )


def read_hypotheses(output):
    """The translations fairseq-generate and fairseq-interactive print, one H- line each.

    Args:
        output: the command's output (stdout, where the H- lines go, or stdout + stderr).

    Returns:
        {sentence id (int): (score, hypothesis)}: the score in base 2, as printed.
    """
    found = re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", output, flags=re.M)
    hypotheses = {int(i): (float(score), text) for i, score, text in found}
    assert len(hypotheses) == len(found), "a sentence id printed twice"
    return hypotheses


def write_tiny_corpus(directory, n_train=400, n_valid=40, n_test=40, seed=0):
    """A toy de->en-like pair the tests can learn in a few updates.

    The target is the source with every word mapped through a fixed dictionary and the
    sentence reversed, so attention has to align words across positions.
    Writes train/valid/test.{src,tgt} into `directory` and returns it.
    """
    rng = random.Random(seed)
    src_vocab = [f"s{i}" for i in range(30)]
    mapping = {w: f"t{i}" for i, w in enumerate(src_vocab)}
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test)):
        src_lines, tgt_lines = [], []
        for _ in range(n):
            words = [rng.choice(src_vocab) for _ in range(rng.randint(3, 9))]
            src_lines.append(" ".join(words))
            tgt_lines.append(" ".join(mapping[w] for w in reversed(words)))
        (directory / f"{split}.src").write_text("\n".join(src_lines) + "\n")
        (directory / f"{split}.tgt").write_text("\n".join(tgt_lines) + "\n")
    return directory


def preprocess(raw_dir, dest_dir, src="src", tgt="tgt"):
    """fairseq-preprocess the corpus written by write_tiny_corpus, with a joined dictionary."""
    raw_dir = Path(raw_dir)
    run(
        [
            fairseq_command("fairseq-preprocess"),
            "--source-lang",
            src,
            "--target-lang",
            tgt,
            "--trainpref",
            raw_dir / "train",
            "--validpref",
            raw_dir / "valid",
            "--testpref",
            raw_dir / "test",
            "--destdir",
            dest_dir,
            "--joined-dictionary",
            "--workers",
            "1",
        ]
    )
    return Path(dest_dir)
