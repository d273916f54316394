"""Every shell block of README.md and docs/*.md, checked as DOC_BLOCKS says.

A block is found by its file and its first line ("... #2" for the second block of a file that
starts with the same line). It is checked in one of these ways:
- PARSE: bash runs the block as written, with SUBSTITUTIONS for the shell variables it uses
  without defining, but a program with a dry run runs with --dry-run (the quickstart's --data DIR
  on a de-en copy of the tiny corpus), and each other command of
  the project, fairseq or torch stops once its own argument parser has accepted its arguments (a sitecustomize ends the process after the
  first successful `ArgumentParser.parse_args`); `make` runs as `make -n`, `pip install` checks
  that the extras it names exist, and `sleep` returns at once. So a renamed option, a removed
  architecture or a wrong module fails, while nothing trains. `...` stands for "the rest as
  above" in the docs and is dropped from a command's arguments.
- RUN: bash runs the block as written (cheap commands only, such as a dry run).
- TINY: bash runs the block as written, in a folder whose `data-bin` is the tests' tiny corpus,
  with TINY_LIMITS appended to its fairseq commands (one update, on the CPU, short
  translations): the documented workflow trains a model of the documented architecture and
  options, saves it where the next command loads it, and translates every test sentence.
- Trained(check): bash runs the block as written, with TINY's limits, in a folder where
  data-bin (or each data-bin/NAME) is the tiny corpus and each checkpoints/NAME/checkpoint_best.pt
  it reads is a tiny model of the normalizer NAME starts with (conftest's trained_model, or, with
  logs=True, trained there with a --log-file and validations, as a block that draws learning
  curves needs), or what the shell `prelude` wrote there; then check(folder, output).
- SYNOPSIS: a usage line with [optional] parts: every --option it names must be in the
  command's --help.
- a function: an output sample, checked against the code that prints it.

A block that is not in the table fails the test, and so does an entry whose block is gone.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from fairseq_entmax.pipeline.tools import bin_dir
from helpers import write_tiny_corpus

REPO = Path(__file__).resolve().parents[1]

PACKAGE_FOLDER = str(REPO / "fairseq_entmax")
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}
PARSE, RUN, SYNOPSIS, TINY = "parse", "run", "synopsis", "tiny"

# The shell variables blocks use without defining them.
SUBSTITUTIONS = {"USER_DIR": PACKAGE_FOLDER, "NODE": "0", "HOST": "127.0.0.1"}


def shell_blocks():
    """(file relative to the repository, line, first line, text) of each fenced shell block."""
    for path in DOC_FILES:
        text = path.read_text(encoding="utf-8")
        seen = {}
        for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M):
            if match.group(1) in SHELL_LANGUAGES and match.group(2).strip():
                line = text[: match.start()].count("\n") + 1
                first = match.group(2).strip().splitlines()[0]
                # A later block of the same file with the same first line is named "... #2".
                seen[first] = seen.get(first, 0) + 1
                name = first if seen[first] == 1 else f"{first} #{seen[first]}"
                yield str(path.relative_to(REPO)), line, name, match.group(2)


def _source_has(path, *snippets):
    """A check of an output sample: each snippet is in the sample and in the code at `path` (a
    file or a folder) that prints it."""

    def check(block):
        files = [REPO / path] if (REPO / path).is_file() else sorted((REPO / path).rglob("*.py"))
        source = "".join(f.read_text(encoding="utf-8") for f in files)
        assert all(snippet in block for snippet in snippets), f"the sample lost one of {snippets}"
        missing = [snippet for snippet in snippets if snippet not in source]
        assert not missing, f"{path} no longer prints {missing}"

    return check


def _toy_pair_is_in_the_corpus(block):
    from examples.quickstart.toy_language import write_toy_corpus

    pairs = dict(line.split(": ", 1) for line in block.strip().splitlines())
    with tempfile.TemporaryDirectory() as folder:
        directory, src, tgt = write_toy_corpus(Path(folder))
        sources = (directory / f"train.{src}").read_text(encoding="utf-8").splitlines()
        targets = (directory / f"train.{tgt}").read_text(encoding="utf-8").splitlines()
    assert (pairs[src], pairs[tgt]) in set(zip(sources, targets))


def _quickstart_plan_is_printed(block):
    """The plan sample is what own_corpus_plan prints for the counts and timed rates the sample states."""
    from examples.quickstart import quickstart

    plan = block.strip().splitlines()[0]
    pairs, tokens, merges = re.match(
        r"plan: (\d+) training pairs, (\d+) batch tokens per pass; (\d+) BPE", plan
    ).groups()
    cap = re.search(r"at most (\d+) updates", plan).group(1)
    threads, timed = re.search(r"at (\d+) thread\(s\) \(--threads\): (.*) s per update", block).groups()
    rates = {name: float(rate) for name, rate in (pair.split() for pair in timed.split(", "))}
    size = dict(quickstart.OWN_CORPUS, bpe_merges=int(merges), max_update=int(cap))
    assert int(cap) == quickstart.own_corpus_max_update(int(tokens)), "the sample's cap is not the rule's"
    printed = quickstart.own_corpus_plan(size, {"train": int(pairs)}, int(tokens), rates, False, threads=int(threads))
    assert block.strip().splitlines() == printed


class Trained:
    """A block run on tiny trained models (the module's docstring); check(folder, output)."""

    def __init__(self, check, logs=False, prelude=None):
        self.check, self.logs, self.prelude = check, logs, prelude


def _analysis_of_three_models(folder, output):
    analysis = json.loads((folder / "analysis" / "analysis.json").read_text())
    assert [model["name"] for model in analysis["models"]] == ["softmax", "entmax15", "alpha_entmax"], output
    assert {model["subset"] for model in analysis["models"]} == {"valid"}
    written = (folder / "analysis" / "written_files.txt").read_text().split()
    assert all((folder / "analysis" / name).stat().st_size > 0 for name in written) and len(written) > 3


def _finetuned_from_softmax(folder, output):
    assert "loading pretrained model from checkpoints/softmax/checkpoint_best.pt" in output, output[-2000:]
    assert "encoder.layers.0.self_attn.normalizer.alpha_logit: not in the checkpoint" in output, output[-2000:]
    assert (folder / "checkpoints" / "alpha_entmax_finetuned" / "checkpoint_best.pt").is_file()


# The softmax model of the same architecture that docs/fairseq.md's fine-tuning starts from.
SOFTMAX_TO_FINETUNE = """fairseq-train data-bin --user-dir $USER_DIR --arch adaptively_sparse_transformer_iwslt_de_en \\
    --share-all-embeddings --attention-normalizer softmax --optimizer adam --lr 5e-4 \\
    --criterion label_smoothed_cross_entropy --max-tokens 4096 --save-dir checkpoints/softmax
"""


def _learning_curves_of_two_normalizers(folder, output):
    assert "learning curves: entmax15 (2 runs), alpha (1 run)" in output, output[-2000:]
    assert (folder / "analysis" / "learning_curves.png").stat().st_size > 0


# (file, the block's first line) -> how it is checked.
DOC_BLOCKS = {
    ("README.md", "make demo   # set up .venv, then train softmax / 1.5-entmax / alpha-entmax / top-k models on a built-in toy corpus and print their table"): PARSE,
    ("README.md", 'USER_DIR=$(python -c "import fairseq_entmax, os; print(os.path.dirname(fairseq_entmax.__file__))")'): TINY,
    ("README.md", "fairseq-entmax-analyze DATA-BIN --user-dir $USER_DIR --path CKPT [--path CKPT ...] \\"): SYNOPSIS,
    ("docs/analysis.md", "fairseq-entmax-analyze data-bin/iwslt14.tokenized.de-en \\"): Trained(_analysis_of_three_models),
    ("docs/analysis.md", "fairseq-entmax-analyze data-bin/iwslt14.tokenized.de-en \\ #2"): Trained(
        _learning_curves_of_two_normalizers, logs=True
    ),
    ("docs/analysis.md", "{"): _source_has(
        "fairseq_entmax/analysis", "positional_threshold", "interrogation_threshold", "sentence_id"
    ),
    ("docs/fairseq.md", 'USER_DIR=$(python -c "import fairseq_entmax, os; print(os.path.dirname(fairseq_entmax.__file__))")'): TINY,
    ("docs/fairseq.md", "fairseq-generate: error: Refusing to load checkpoint x.pt: it contains a pickled posix.system,"): _source_has(
        "fairseq_entmax/repairs/checkpoint_safety.py", "Refusing to load checkpoint", "not a type fairseq checkpoints hold"
    ),
    ("docs/fairseq.md", "fairseq-train data-bin --user-dir $USER_DIR \\"): Trained(
        _finetuned_from_softmax, prelude=SOFTMAX_TO_FINETUNE
    ),
    ("docs/fairseq.md", "INFO | fairseq_entmax.normalizers.layers | encoder.layers.0.self_attn.normalizer.alpha_logit:"): _source_has(
        "fairseq_entmax/normalizers/layers.py", "not in the checkpoint (trained without learned alpha)", "heads start"
    ),
    ("docs/fairseq.md", "CUDA_VISIBLE_DEVICES=0,1,2,3 fairseq-train data-bin --user-dir $USER_DIR \\"): PARSE,
    ("docs/fairseq.md", "torchrun --nnodes 2 --node_rank $NODE --nproc_per_node 8 \\"): PARSE,
    ("docs/fairseq.md", "for RANK in 0 1; do"): PARSE,
    ("docs/attention.md", "python -m benchmarks.attention --settings raw --tokens 1024 4096 16384"): PARSE,
    ("docs/huggingface.md", "pip install -e '.[huggingface]'     # in a checkout; make setup installs it too"): PARSE,
    ("docs/huggingface.md", ".venv/bin/python -m examples.huggingface.marian_toy           # about 3 minutes on 2 CPU cores"): PARSE,
    ("docs/outputs.md", 'USER_DIR=$(python -c "import fairseq_entmax, os; print(os.path.dirname(fairseq_entmax.__file__))")'): TINY,
    ("docs/recipes.md", ".venv/bin/python -m examples.quickstart.quickstart"): PARSE,
    ("docs/recipes.md", ".venv/bin/python -m examples.quickstart.quickstart --data DIR --src de --tgt en"): PARSE,
    ("docs/recipes.md", ".venv/bin/python -m examples.quickstart.convergence --data TED --src de --tgt en \\"): PARSE,
    ("docs/recipes.md", "plan: 16000 training pairs, 434307 batch tokens per pass; 8000 BPE merges; at most 12000 updates of 2048 tokens per model, 56.6 passes over the training data (1.5 x the 37.7 passes the slowest measured model took to stop, 1500 to 12000); each model stops earlier once its validation accuracy has not improved for 3 epochs and is evaluated with its best checkpoint; 3+3 layers of width 128"): _quickstart_plan_is_printed,
    ("docs/recipes.md", "svo: le vebezo fe sosota un nefaris rive le dudu"): _toy_pair_is_in_the_corpus,
    ("docs/recipes.md", ".venv/bin/python -m examples.translation.recipe TASK [--dry-run [--num-gpus N]] [--smoke] [--raw-dir DIR]"): SYNOPSIS,
    ("docs/recipes.md", ".venv/bin/python -m examples.translation.recipe iwslt14 [--models softmax topk sparsemax entmax15] [--seed 1 2 3]"): SYNOPSIS,
    ("docs/recipes.md", ".venv/bin/python -m examples.translation.recipe iwslt17 --dry-run --num-gpus 4"): RUN,
    ("docs/reproduction.md", "make setup"): PARSE,
    ("docs/reproduction.md", "export OMP_NUM_THREADS=1"): PARSE,
}  # fmt: skip

# Ends a Python process once its first ArgumentParser.parse_args has accepted its arguments,
# and records that it did, under the call's id.
SITECUSTOMIZE = textwrap.dedent(
    """
    import argparse
    import os

    if os.environ.get("DOC_CALL_ID"):
        _parse_args = argparse.ArgumentParser.parse_args

        def _parse_and_stop(self, args=None, namespace=None):
            _parse_args(self, args, namespace)
            with open(os.environ["DOC_LOG"], "a") as log:
                log.write(f"PARSED {os.environ['DOC_CALL_ID']} {self.prog}\\n")
            os._exit(0)

        argparse.ArgumentParser.parse_args = _parse_and_stop
    """
)

# The commands of a PARSE block, as bash functions. A call of one that names a program (not
# `python -c`) must reach its parser; a program with a dry run (the recipes, the reduced-scale
# reproduction, the attention benchmark, the quickstart) runs it instead, so its own checks and its
# whole plan run. A quickstart on a user's corpus (--data DIR) reads DOC_CORPUS, a de-en copy of
# the tiny corpus, with the cap its dry run needs (--max-update).
SHIMS = textwrap.dedent(
    """
    set -eo pipefail
    _doc_call() {
        local name=$1; shift
        local args=() a
        for a in "$@"; do [[ $a == "..." ]] || args+=("$a"); done
        local id="$name-$BASHPID-$RANDOM"
        local rc=0
        local own_corpus=0
        [[ " ${args[*]} " =~ " examples.quickstart.quickstart " && " ${args[*]} " =~ " --data " ]] && own_corpus=1
        if [[ $own_corpus == 1 ]]; then
            local i
            for i in "${!args[@]}"; do [[ ${args[i]} == --data ]] && args[i+1]=$DOC_CORPUS; done
            args+=(--max-update 100)
        fi
        if [[ " ${args[*]} " =~ " "(examples.reproduction.reduced_scale|examples.translation.recipe|benchmarks.attention|examples.quickstart.quickstart)" " ]]; then
            command "$name" "${args[@]}" --dry-run > /dev/null || rc=$?
            if [[ $rc != 0 ]]; then echo "FAIL $name --dry-run exited $rc" >> "$DOC_LOG"; return $rc; fi
            echo "DRY-RUN $name ${args[*]}" >> "$DOC_LOG"; return 0
        fi
        DOC_CALL_ID=$id command "$name" "${args[@]}" || rc=$?
        if [[ $rc != 0 ]]; then echo "FAIL $name exited $rc" >> "$DOC_LOG"; return $rc; fi
        if [[ ${args[0]} != -c ]] && ! grep -q "^PARSED $id " "$DOC_LOG"; then
            echo "FAIL $name never parsed its arguments" >> "$DOC_LOG"; return 1
        fi
    }
    for tool in fairseq-preprocess fairseq-train fairseq-generate fairseq-interactive \\
            fairseq-entmax-analyze torchrun python .venv/bin/python; do
        eval "function $tool { _doc_call $tool \\"\\$@\\"; }"
    done
    make() { command make -n "$@" > /dev/null || { echo "FAIL make $*" >> "$DOC_LOG"; return 1; }; }
    pip() { command python -c "$PIP_CHECK" "$@" || { echo "FAIL pip $*" >> "$DOC_LOG"; return 1; }; }
    sleep() { :; }
    """
)

# Appended to the fairseq commands of a TINY block (later options win over the block's own):
# one update of at most 256 tokens (one of a documented architecture on the whole tiny corpus
# takes 9 s of CPU), and only checkpoint_best.pt without the optimizer's state (their checkpoints are
# hundreds of MB each).
TINY_LIMITS = {
    "fairseq-train": (
        "--max-update 1 --max-tokens 256 --cpu --num-workers 0 --no-epoch-checkpoints --no-last-checkpoints "
        "--no-save-optimizer-state"
    ),
    "fairseq-generate": "--cpu --max-len-a 0 --max-len-b 4",
}
TINY_SHIMS = "set -eo pipefail\n" + "".join(
    f'{tool}() {{ command {tool} "$@" {limits}; }}\n' for tool, limits in TINY_LIMITS.items()
)
# The tiny corpus' test sentences (tests/helpers.write_tiny_corpus).
TINY_TEST_SENTENCES = 40

# `pip install -e '.[EXTRA]'`: the extras exist in pyproject.toml.
PIP_CHECK = textwrap.dedent(
    """
    import re, sys, tomllib
    extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
    named = [e for arg in sys.argv[1:] for m in re.finditer(r"\\[([\\w,-]+)\\]", arg) for e in m.group(1).split(",")]
    assert named and set(named) <= set(extras), f"extras {named} not all in {sorted(extras)}"
    """
)


def _environment(tmp_path, parse):
    environment = dict(os.environ, **SUBSTITUTIONS, PATH=f"{bin_dir()}{os.pathsep}{os.environ['PATH']}")
    environment["DOC_LOG"] = str(tmp_path / "calls.log")
    environment["PIP_CHECK"] = PIP_CHECK
    if parse:
        corpus = write_tiny_corpus(tmp_path / "tiny")
        environment["DOC_CORPUS"] = str(tmp_path / "corpus")
        (tmp_path / "corpus").mkdir()
        for path in corpus.iterdir():
            language = {".src": ".de", ".tgt": ".en"}[path.suffix]
            shutil.copy(path, tmp_path / "corpus" / path.with_suffix(language).name)
        (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
        environment["PYTHONPATH"] = os.pathsep.join([str(tmp_path), environment.get("PYTHONPATH", "")])
    return environment


def _run_block(block, tmp_path, parse):
    (tmp_path / "calls.log").touch()
    proc = subprocess.run(
        ["bash", "-c", (SHIMS if parse else "set -eo pipefail\n") + block],
        cwd=REPO,
        env=_environment(tmp_path, parse),
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls = (tmp_path / "calls.log").read_text()
    assert proc.returncode == 0 and "FAIL" not in calls, f"{calls}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return calls, proc.stdout


def _run_with_tiny_limits(folder, script, check=None):
    """Run a bash script in folder with TINY's limits and the console scripts on PATH; it must
    exit 0, and check(proc), if given, runs before the checkpoints it wrote are removed (the
    documented architectures' are hundreds of MB). Returns the finished process."""
    environment = dict(os.environ, **SUBSTITUTIONS, PATH=f"{bin_dir()}{os.pathsep}{os.environ['PATH']}")
    try:
        proc = subprocess.run(
            ["bash", "-c", TINY_SHIMS + script],
            cwd=folder,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
        if check is not None:
            check(proc)
        return proc
    finally:
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)


def _run_on_tiny_data(block, tmp_path, data_bin):
    """Run a TINY block; returns its stdout, with one block of H- lines per translation command."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "data-bin").symlink_to(data_bin)
    return _run_with_tiny_limits(folder, block).stdout


def _run_on_trained_models(block, tmp_path, request, how):
    """Run a Trained block (the module's docstring) and its check."""
    from helpers import train_tiny

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "fairseq_entmax").symlink_to(PACKAGE_FOLDER)  # `--user-dir fairseq_entmax`, as in a checkout
    data_bin = request.getfixturevalue("tiny_data").data_bin
    names = set(re.findall(r"data-bin/([\w.-]+)", block))
    if not names:
        (folder / "data-bin").symlink_to(data_bin)
    for name in names:
        (folder / "data-bin").mkdir(parents=True, exist_ok=True)
        (folder / "data-bin" / name).symlink_to(data_bin)
    for name in [] if how.prelude else re.findall(r"checkpoints/([\w-]+)/checkpoint_best\.pt", block):
        prefix, _, seed = name.partition("-seed")
        normalizer = {"alpha": "alpha_entmax"}.get(prefix, prefix)
        save_dir = folder / "checkpoints" / name
        save_dir.mkdir(parents=True)
        if how.logs:  # validated every 10 updates, into a --log-file the checkpoint records
            options = f"--max-update 20 --validate-interval-updates 10 --seed {seed} --log-format simple"
            log = ["--log-file", save_dir / "train.log"]
            train_tiny(data_bin, save_dir, "--attention-normalizer", normalizer, *options.split(), *log)
            shutil.copy(save_dir / "checkpoint_last.pt", save_dir / "checkpoint_best.pt")
        else:
            trained = request.getfixturevalue("trained_model")(normalizer)
            (save_dir / "checkpoint_best.pt").symlink_to(trained.checkpoint)
    script = (how.prelude or "") + block
    _run_with_tiny_limits(folder, script, lambda proc: how.check(folder, proc.stdout + proc.stderr))


def _check_synopsis(block):
    words = block.split()
    program = [sys.executable, *words[1:3]] if words[0].endswith("python") else [str(bin_dir() / words[0])]
    proc = subprocess.run([*program, "--help"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    options = set(re.findall(r"--[a-z][a-z0-9-]*", block))
    missing = sorted(option for option in options if not re.search(rf"{option}\b", proc.stdout))
    assert not missing, f"{' '.join(program)} --help has no {missing}"


BLOCKS = {(file, first): (line, text) for file, line, first, text in shell_blocks()}


@pytest.fixture(scope="module")
def tiny_outputs():
    """The outputs of the TINY blocks run so far, by text: a block that two files repeat runs once."""
    return {}


def test_every_shell_block_of_the_docs_is_in_the_table():
    untested = [
        f"{file}:{line}: {first}" for (file, first), (line, _) in BLOCKS.items() if (file, first) not in DOC_BLOCKS
    ]
    gone = [f"{file}: {first}" for file, first in DOC_BLOCKS if (file, first) not in BLOCKS]
    assert not untested, "add these blocks to DOC_BLOCKS in tests/test_doc_commands.py: " + "; ".join(untested)
    assert not gone, "these DOC_BLOCKS entries match no block any more: " + "; ".join(gone)


@pytest.mark.parametrize("key", sorted(DOC_BLOCKS), ids=lambda key: f"{key[0]}:{key[1][:40]}")
def test_documented_block(key, tmp_path, request, tiny_outputs):
    if key not in BLOCKS:
        pytest.fail(f"{key[0]} has no block starting {key[1]!r}")
    how, (line, block) = DOC_BLOCKS[key], BLOCKS[key]
    if how == SYNOPSIS:
        _check_synopsis(block)
    elif how in (PARSE, RUN):
        calls, _ = _run_block(block, tmp_path, parse=how == PARSE)
        if how == PARSE and any(word in block for word in ("fairseq-", ".venv/bin/python -m", "torchrun")):
            assert "PARSED" in calls or "DRY-RUN" in calls, f"{key[0]}:{line}: no command reached its parser"
    elif how == TINY:
        if block not in tiny_outputs:
            tiny_outputs[block] = _run_on_tiny_data(block, tmp_path, request.getfixturevalue("tiny_data").data_bin)
        output = tiny_outputs[block]
        translations = block.count("fairseq-generate ")
        sentences = {int(i) for i in re.findall(r"^H-(\d+)\t", output, flags=re.M)}
        assert translations and sentences == set(range(TINY_TEST_SENTENCES)), output[-2000:]
        assert output.count("Generate test with beam=") == translations, output[-2000:]
        if "--print-alignment" in block:
            assert len(re.findall(r"^A-\d+\t", output, flags=re.M)) >= TINY_TEST_SENTENCES
    elif isinstance(how, Trained):
        _run_on_trained_models(block, tmp_path, request, how)
    else:
        how(block)


def test_a_program_with_a_dry_run_runs_its_own_checks(tmp_path):
    """Past its parser: the reduced-scale reproduction's dry run refuses a data folder without the
    corpus, and prints its plan for a good one."""
    block = f".venv/bin/python -m examples.reproduction.reduced_scale --data {tmp_path} --work-dir {tmp_path}/w\n"
    with pytest.raises(AssertionError, match="--dry-run exited 2"):
        _run_block(block, tmp_path, parse=True)
    (tmp_path / "good").mkdir()
    block = ".venv/bin/python -m examples.reproduction.reduced_scale --budget tiny\n"
    calls, _ = _run_block(block, tmp_path / "good", parse=True)
    assert "DRY-RUN .venv/bin/python -m examples.reproduction.reduced_scale --budget tiny" in calls


def test_a_rotten_option_fails_the_parse(tmp_path):
    """The PARSE check catches a command whose option no longer exists."""
    block = "fairseq-train data-bin --user-dir $USER_DIR --arch adaptively_sparse_transformer --no-such-option 1\n"
    with pytest.raises(AssertionError, match="fairseq-train exited 2"):
        _run_block(block, tmp_path, parse=True)
    (tmp_path / "script").mkdir()
    block = ".venv/bin/python -m examples.quickstart.quickstart --no-such-option\n"
    with pytest.raises(AssertionError, match="exited 2"):
        _run_block(block, tmp_path / "script", parse=True)
