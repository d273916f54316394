"""Shared helpers for tests that go through the real fairseq commands.

The tests run fairseq's console scripts (fairseq-preprocess, fairseq-train, ...) from the
same virtual environment as pytest, with `--user-dir` pointing at the package, as a user would.
The tiny models' fairseq-train arguments (TINY_MODEL_ARGS, OPTIMIZATION_ARGS, TRAINING_ARGS)
are here, for train_tiny; conftest imports the first and the last, and most test files import
them from conftest.
"""

import contextlib
import importlib
import io
import random
import re
import shlex
from pathlib import Path

from fairseq_entmax import USER_DIR  # the tests import it from here too
from fairseq_entmax.pipeline.tools import Finished, run_logged, tool

REPO = Path(__file__).resolve().parents[1]


def arguments(command_line):
    """A command line written as the shell reads it, as a list of arguments.

    Args:
        command_line: options and values, on as many lines as reads well; quoted as in a shell.

    Returns:
        The arguments, a list of str (shlex.split).
    """
    return shlex.split(command_line)


# The tiny models of the tests (conftest's trained_model, and the tests that train their own).
# 2+2 layers, width 32, 4 heads, 200 updates (conftest's TINY_MAX_UPDATE) of ~200 tokens: trains
# in seconds and learns the tiny corpus (unigram precision of beam search ~40-80%, BLEU ~5-30 by
# normalizer), so its attention has structure. Small batches learn more per second here than
# large ones.
TINY_MODEL_ARGS = arguments(
    """
    --arch adaptively_sparse_transformer
    --encoder-layers 2 --decoder-layers 2
    --encoder-embed-dim 32 --decoder-embed-dim 32
    --encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64
    --encoder-attention-heads 4 --decoder-attention-heads 4
    --share-all-embeddings --dropout 0
    """
)
# How every tiny model is optimised (test_evaluation_batches trains a plain transformer
# with these too, in its own batches).
OPTIMIZATION_ARGS = arguments(
    """
    --optimizer adam --adam-betas '(0.9, 0.98)' --lr 0.005 --lr-scheduler fixed
    --criterion label_smoothed_cross_entropy --cpu --seed 1
    """
)
# The languages of write_tiny_corpus, for the commands that need them named.
TINY_LANGUAGES = arguments("--source-lang src --target-lang tgt")
# No data-loader process in the commands that load a checkpoint (run_on_checkpoint), as the
# drivers pass on the CPU (fairseq_entmax/pipeline/training.py's CPU_ARGS): in a command run in this
# process its shutdown waits out its 5 s timeout, which was most of a tiny fairseq-generate.
NO_LOADER_PROCESS = arguments("--num-workers 0")
# --num-workers 0: the tiny corpus' epochs are a few updates each, and fairseq's loader process
# per epoch cost a tiny training 15% of its time.
TRAINING_ARGS = OPTIMIZATION_ARGS + arguments(
    """
    --max-tokens 200 --log-format json --log-interval 10 --no-progress-bar
    --no-epoch-checkpoints --validate-interval 1000 --save-interval 1000 --num-workers 0
    """
)


def fairseq_command(name):
    """Path of a fairseq console script (fairseq-train, ...), as the pipelines find it (tool)."""
    return tool(name)


def run(args, check=True, timeout=None, cwd=None, env=None, input=None, process=False):
    """Run a command through the project's one runner (fairseq_entmax.pipeline.tools.run_logged), its
    output captured, with one CPU thread (the suite's commands share the machine's cores).

    fairseq's console scripts run in this process, as run_logged runs them, unless `process`
    (or timeout, env or cwd) asks for a process of their own: a test of the command itself (its
    exit status, its messages, a real `--user-dir` load) asks for one.

    Args:
        args: the command and its arguments.
        check: raise when it exits non-zero.
        timeout: seconds, or None; a command with a time limit runs as a process.
        cwd: the folder it runs in.
        env: environment variables to set on top of this process's.
        input: text typed into its stdin.
        process: run it as a process of its own (with a 10-minute limit unless timeout says).

    Returns:
        The finished command (tools.Finished: returncode, stdout, stderr).

    Raises:
        ToolError: it failed (with check) or ran past the timeout; the message shows the command
            and the end of its output.
    """
    if process and timeout is None:
        timeout = 600
    return run_logged(args, threads=1, env=env, cwd=cwd, timeout=timeout, input=input, check=check)


def run_main(program, check=True):
    """Run `python -m MODULE ARGUMENTS` by calling the module's main(argv) in this process, from
    the repository root, its output captured. For a test of what a program plans or checks
    before any long work (a --dry-run, a refused input): its own process would spend a second
    and a half importing torch. The real process runs in the tests of its full runs.

    Args:
        program: (python, "-m", module, *arguments).
        check: fail the test when it exits non-zero.

    Returns:
        The finished command (tools.Finished: returncode, stdout, stderr).
    """
    _, flag, module, *arguments = [str(part) for part in program]
    assert flag == "-m", program
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            returncode = importlib.import_module(module).main(arguments)
        except SystemExit as stop:  # argparse's refusals
            returncode = stop.code
    finished = Finished(program, returncode or 0, stdout.getvalue(), stderr.getvalue())
    assert not check or finished.returncode == 0, finished.stdout + finished.stderr
    return finished


def train_tiny(data_bin, save_dir, *arguments, model_args=TINY_MODEL_ARGS, **run_options):
    """Train a tiny model with fairseq-train --user-dir fairseq_entmax, as conftest's
    trained_model does.

    Args:
        data_bin: the binarized corpus (conftest's tiny_data.data_bin).
        save_dir: fairseq-train's --save-dir, where checkpoint_last.pt goes.
        *arguments: the run's own fairseq-train arguments (normalizer, criterion,
            --max-update, ...); they come after TRAINING_ARGS, and win over them.
        model_args: the architecture and its sizes (default TINY_MODEL_ARGS).
        **run_options: passed to run (check, ...).

    Returns:
        fairseq-train's finished process, as run returns it, with its stdout and stderr
        joined as .log (the json log lines of --log-format json).
    """
    proc = run(
        [
            fairseq_command("fairseq-train"),
            data_bin,
            "--user-dir",
            USER_DIR,
            *model_args,
            *TRAINING_ARGS,
            "--save-dir",
            save_dir,
            *arguments,
        ],
        **run_options,
    )
    proc.log = proc.stdout + proc.stderr
    return proc


def run_on_model(command, model, *arguments, **run_options):
    """Run a fairseq command that loads a trained model, as a user types it.

    Args:
        command: the console script, e.g. "fairseq-generate", "fairseq-interactive".
        model: what conftest's `trained_model` returns (its data_bin and checkpoint are used).
        *arguments: the command's other arguments, after `DATA-BIN --user-dir ... --path ...`.
        **run_options: passed to run (input, check, ...).

    Returns:
        The finished command, as run returns it.
    """
    return run_on_checkpoint(command, model.data_bin, model.checkpoint, *arguments, **run_options)


def run_on_checkpoint(command, data_bin, checkpoint, *arguments, **run_options):
    """run_on_model for a checkpoint that conftest's `trained_model` did not train (a test's
    own fairseq-train run): `command DATA-BIN --user-dir ... --path CHECKPOINT *arguments
    --num-workers 0` (NO_LOADER_PROCESS).

    Returns:
        The finished command, as run returns it.
    """
    return run(
        [
            fairseq_command(command),
            data_bin,
            "--user-dir",
            USER_DIR,
            "--path",
            checkpoint,
            *arguments,
            *NO_LOADER_PROCESS,
        ],
        **run_options,
    )


def run_analyze(data_bin, output_dir, *arguments, **run_options):
    """fairseq-entmax-analyze on the CPU, as a user types it.

    Args:
        data_bin: the binarized corpus.
        output_dir: its --output-dir.
        *arguments: the models (--path, --name, --train-log, ...) and the other options.
        **run_options: passed to run.

    Returns:
        The finished command, as run returns it.
    """
    command = [fairseq_command("fairseq-entmax-analyze"), data_bin, "--user-dir", USER_DIR, "--cpu"]
    return run([*command, *arguments, "--output-dir", output_dir], **run_options)


def run_interactive(data_bin, checkpoint, sources, *arguments, **run_options):
    """fairseq-interactive on a tiny corpus' model, the source sentences typed one per line.

    Args:
        data_bin: the binarized corpus (its dictionaries; languages "src" and "tgt").
        checkpoint: the model's checkpoint.
        sources: the sentences to translate.
        *arguments: the command's other arguments (--beam, --cpu, ...).
        **run_options: passed to run.

    Returns:
        The finished command, as run returns it.
    """
    return run_on_checkpoint(
        "fairseq-interactive",
        data_bin,
        checkpoint,
        *arguments,
        *TINY_LANGUAGES,
        input="\n".join(sources) + "\n",
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


def preprocess(raw_dir, dest_dir, src="src", tgt="tgt", **run_options):
    """fairseq-preprocess the corpus written by write_tiny_corpus, with a joined dictionary.
    run_options are run's (process, ...)."""
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
        ],
        **run_options,
    )
    return Path(dest_dir)


def assert_run_executed_its_dry_run(program, options, work):
    """The first run recorded in work/commands.log executed exactly the lines that the same
    command's --dry-run prints (after its header line), and each later run is listed apart.

    Args:
        program: the command's start, e.g. (python, "-m", "examples.translation.recipe").
        options: its options, without --work-dir and --dry-run.
        work: the work dir the run used.

    Returns:
        The recorded runs: for each, the lines it executed.
    """
    dry_run = run_main([*program, *options, "--work-dir", work, "--dry-run"]).stdout.splitlines()
    runs = []
    for line in (Path(work) / "commands.log").read_text(encoding="utf-8").splitlines():
        if line.startswith("# run of "):
            runs.append([])
        else:
            runs[-1].append(line)
    assert dry_run[0].startswith("# ") and runs[0] == dry_run[1:]
    return runs
