"""The quickstart (`make demo`) as a user runs it: examples/quickstart/quickstart.py end to end
at its --tiny size (toy corpus, BPE, fairseq-preprocess, four fairseq-train runs,
fairseq-generate, sacrebleu, fairseq-entmax-analyze, table), on a user's own corpus (trained
until the patience or the cap stops it, the table saying which), with bad input, and resumed
after an interrupt."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from examples.quickstart.toy_language import ToyLanguagePair, write_toy_corpus
from fairseq_entmax.names import ATTENTION_TYPES
from fairseq_entmax.pipeline.tables import format_seconds
from helpers import assert_run_executed_its_dry_run, run, write_tiny_corpus

# Every test here trains through fairseq-train or runs a fairseq command, a recipe or the quickstart.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# As `make demo` runs it, from the repository root (cwd=REPO).
QUICKSTART = (sys.executable, "-m", "examples.quickstart.quickstart")
NORMALIZERS = ("softmax", "entmax15", "alpha_entmax", "topk")


@pytest.fixture(scope="module")
def tiny_demo(tmp_path_factory):
    """One --tiny quickstart run with all four normalizers (module-scoped: about a minute)."""
    work = tmp_path_factory.mktemp("quickstart") / "work"
    proc = run([*QUICKSTART, "--tiny", "--work-dir", work], timeout=900, cwd=REPO)
    return work, proc.stdout + proc.stderr


def test_quickstart_executed_exactly_its_dry_run(tiny_demo):
    """The toy pair's run: every command it started and each Python step it called, in order,
    are the lines of its dry run."""
    work, _ = tiny_demo
    [executed] = assert_run_executed_its_dry_run(QUICKSTART, ["--tiny"], work)
    assert sum(line.split()[0].endswith("fairseq-train") for line in executed) == len(NORMALIZERS)
    assert executed[-1].split()[0].endswith("fairseq-entmax-analyze")


def test_quickstart_dry_run_on_own_corpus_needs_the_cap(tmp_path):
    """On a user's corpus the cap is sized from the BPE-segmented text, which a dry run does not
    make: it asks for --max-update instead of printing other commands than the run's."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=30, n_valid=5, n_test=5)
    command = [*QUICKSTART, "--data", corpus, "--src", "src", "--tgt", "tgt", "--work-dir", tmp_path / "w", "--dry-run"]
    proc = run(command, check=False, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "--dry-run on your corpus needs --max-update" in proc.stderr
    assert not (tmp_path / "w").exists()


def test_quickstart_prints_one_row_per_model_with_scores_density_alpha_and_time(tiny_demo):
    work, output = tiny_demo
    rows = {row["model"]: row for row in json.loads((work / "results.json").read_text())}
    assert set(rows) == set(NORMALIZERS)
    for normalizer, row in rows.items():
        assert 0.0 <= row["bleu"] <= 100.0 and 0.0 <= row["chrf"] <= 100.0
        assert row["bleu_signature"].startswith("nrefs:1|") and "tok:13a" in row["bleu_signature"]
        assert row["chrf_signature"].startswith("nrefs:1|")
        assert row["train_seconds"] > 0
        assert set(row["density"]) == set(ATTENTION_TYPES)
        # The table row of this model, as printed.
        assert any(line.startswith(f"| {normalizer} ") for line in output.splitlines()), output[-3000:]
    # Softmax gives every key weight; top-k (k = 2 at this size) keeps a fraction of them.
    assert all(rows["softmax"]["density"][t] > 0.99 for t in ATTENTION_TYPES)
    assert all(rows["topk"]["density"][t] < 0.9 for t in ATTENTION_TYPES)
    # Fixed alphas are reported as such, learned ones lie in the clamp range [1.01, 2].
    assert all(rows["entmax15"]["alpha"][t][0] == pytest.approx(1.5) for t in ATTENTION_TYPES)
    for t in ATTENTION_TYPES:
        mean, low, high = rows["alpha_entmax"]["alpha"][t]
        assert 1.01 - 1e-6 <= low <= mean <= high <= 2.0 + 1e-6
    assert "alpha" not in rows["topk"] or not rows["topk"]["alpha"]
    assert "BLEU: nrefs:1" in output and "chrF: nrefs:1" in output
    assert list((work / "analysis").glob("*.png")), "fairseq-entmax-analyze wrote no figures"
    # The toy pair keeps its fixed budget: no patience, the last checkpoint, no stopping column.
    for normalizer in NORMALIZERS:
        command = (work / "models" / f"{normalizer}-seed1" / "train.log").read_text().splitlines()[0].split()
        assert "--patience" not in command and command[command.index("--max-update") + 1] == "20"
        assert Path(rows[normalizer]["checkpoint"]).name == "checkpoint_last.pt"
    assert "stopped by" not in output and "converged" not in output


def test_quickstart_translations_cover_the_test_set(tiny_demo):
    work, _ = tiny_demo
    n_test = len((work / "raw" / "test.sov").read_text().splitlines())
    for normalizer in NORMALIZERS:
        hypotheses = (work / "eval" / f"{normalizer}-seed1" / "test.hyp").read_text().split("\n")[:-1]
        assert len(hypotheses) == n_test


def test_toy_pair_reorders_and_maps_every_content_word(tmp_path):
    """The documented grammar: the verb goes last with its tense suffix, subject first."""
    pair = ToyLanguagePair(seed=0)
    verbs = dict(pair.lexicon["verb"])
    nouns = dict(pair.lexicon["noun"])
    directory, src, tgt = write_toy_corpus(tmp_path, n_train=200, n_valid=20, n_test=20, seed=0)
    sources = (directory / f"train.{src}").read_text().splitlines()
    targets = (directory / f"train.{tgt}").read_text().splitlines()
    assert len(sources) == len(targets) == 200
    assert len(set(sources)) == 200
    for source, target in zip(sources, targets):
        words, target_words = source.split(), target.split()
        verb = next(w for w in words if w in verbs)
        tense = {"fe": "ta", "vo": "ru"}.get(words[words.index(verb) - 1], "")
        assert target_words[-1] == verbs[verb] + tense
        subject_noun = words[1].removesuffix("s") if words[1] not in nouns else words[1]
        assert nouns[subject_noun] in target_words[target_words.index("ga") - 1]
    # Deterministic for a seed.
    again, _, _ = write_toy_corpus(tmp_path / "again", n_train=200, n_valid=20, n_test=20, seed=0)
    assert (again / f"train.{src}").read_text() == "\n".join(sources) + "\n"


@pytest.mark.parametrize("case", ["missing_file", "line_mismatch", "empty", "unknown_language"])
def test_quickstart_rejects_bad_corpus_before_training(tmp_path, case):
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=20, n_valid=5, n_test=5)
    src, tgt = "src", "tgt"
    if case == "missing_file":
        (corpus / "valid.tgt").unlink()
        expected = "missing data files"
    elif case == "line_mismatch":
        (corpus / "train.tgt").write_text("only one line\n")
        expected = "has 20 lines but"
    elif case == "empty":
        for split in ("train", "valid", "test"):
            (corpus / f"{split}.src").write_text("")
            (corpus / f"{split}.tgt").write_text("")
        expected = "empty"
    else:
        tgt = "xx"
        expected = "train.xx"
    work = tmp_path / "work"
    proc = run(
        [*QUICKSTART, "--data", corpus, "--src", src, "--tgt", tgt, "--work-dir", work],
        check=False,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (work / "data-bin").exists() and not (work / "models").exists()


def test_quickstart_argument_errors():
    proc = run([*QUICKSTART, "--data", "somewhere"], check=False, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "--src and --tgt" in proc.stderr
    proc = run([*QUICKSTART, "--data", "x", "--src", "de", "--tgt", "de"], check=False, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "two different languages" in proc.stderr


def test_quickstart_on_own_corpus_resumes_an_interrupted_training(tmp_path):
    """A user's corpus (--data --src --tgt), Ctrl-C during training, then the same command:
    the finished stages are skipped and fairseq-train continues from checkpoint_last.pt
    instead of starting over; the corpus is Moses-tokenised and tokenized BLEU reported."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=300, n_valid=20, n_test=20)
    work = tmp_path / "work"
    # The interrupt comes at the first checkpoint, 3 updates in: the cap leaves about 10 s of
    # training after it (5 s at a cap of 150 were once not enough under a loaded suite).
    cap = 300
    options = ["--tiny", "--data", corpus, "--src", "src", "--tgt", "tgt", "--models", "softmax"]
    command = [*QUICKSTART, *options, "--max-update", str(cap), "--patience", "0", "--work-dir", work]
    # PYTHONFAULTHANDLER: a run that outlives its Ctrl-C is stopped with SIGABRT, which prints
    # where each of its threads was.
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    # Ctrl-C works as in a terminal even when this suite runs as a background job, whose
    # shell started it with SIGINT ignored (an ignored signal is inherited across exec).
    proc = subprocess.Popen(
        [str(c) for c in command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    train_log_path = work / "models" / "softmax-seed1" / "train.log"
    # fairseq logs "Saved checkpoint" once checkpoint_last.pt is completely written.
    deadline = time.time() + 600
    while (
        proc.poll() is None
        and time.time() < deadline
        and not (train_log_path.exists() and "Saved checkpoint" in train_log_path.read_text())
    ):
        time.sleep(0.2)
    assert "Saved checkpoint" in train_log_path.read_text(), "no checkpoint was written before the interrupt"
    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the whole process group, as in a terminal
    try:
        output, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        output, _ = proc.communicate(timeout=60)
        pytest.fail(f"the run went on for 120 s after Ctrl-C; the end of its output:\n{output[-6000:]}")
    finished = (work / "models" / "softmax-seed1" / "train.done").exists()
    assert not finished, f"training finished before the interrupt (exit {proc.returncode}):\n{output[-3000:]}"
    # Ended with a hint (tools.run_reporting_errors), not lost or aborted in torch (repairs.interrupts).
    assert proc.returncode == 130 and "interrupted: the same command again goes on" in output, output[-3000:]
    data_bin_stamp = (work / "data-bin" / "preprocess.done").stat().st_mtime

    resumed = run(command, timeout=900, cwd=REPO)
    assert "resuming from" in resumed.stdout
    train_log = (work / "models" / "softmax-seed1" / "train.log").read_text()
    second_run = train_log[train_log.rindex("$ ") :]
    loaded = re.search(r"Loaded checkpoint \S+ \(epoch (\d+) @ (\d+) updates\)", second_run)
    assert loaded and int(loaded.group(2)) > 0, second_run[-3000:]
    assert (work / "data-bin" / "preprocess.done").stat().st_mtime == data_bin_stamp, "data was rebuilt"
    rows = json.loads((work / "results.json").read_text())
    assert [row["model"] for row in rows] == ["softmax"]
    assert "tok:none" in rows[0]["bleu_tok_signature"]
    assert (work / "tok" / "train.src").exists(), "the user's corpus was not Moses-tokenised"
    assert "| softmax " in resumed.stdout
    assert "| tok BLEU |" in (work / "results.md").read_text(), "no tokenized BLEU column in the table"
    # --patience 0: trained to the cap, and the table says the model may not
    # have converged; the checkpoint evaluated is the best by validation accuracy.
    assert rows[0]["updates"] == cap and rows[0]["stopped_early"] is False
    assert Path(rows[0]["checkpoint"]).name == "checkpoint_best.pt"
    results = (work / "results.md").read_text()
    table_row = next(line for line in results.splitlines() if line.startswith("| softmax "))
    assert [cell.strip() for cell in table_row.split("|")[-3:-1]] == [f"{cap} ({rows[0]['best_update']})", "cap"]
    note = f"Not converged: softmax stopped at the cap of {cap} updates"
    assert note in results and note in resumed.stdout and "compares unconverged models" in results


def test_quickstart_sizes_own_corpus_prints_the_plan_and_stops_on_the_patience(tmp_path):
    """A user's corpus without --tiny: BPE sized by the rule (300 pairs: 1000 merges), the plan
    and its time estimate, from the model's first updates timed on this machine, printed before
    training, --max-update replacing the sized cap (40 here), and a learning rate of ~0, with
    which validation accuracy cannot improve: the patience of 3 epochs stops the 3+3-layer model
    after 4 epochs, in seconds, and the table says so."""
    corpus = write_tiny_corpus(tmp_path / "corpus", n_train=300, n_valid=20, n_test=20)
    work = tmp_path / "work"
    options = ["--data", corpus, "--src", "src", "--tgt", "tgt", "--models", "softmax", "--max-update", "40"]
    output = run([*QUICKSTART, *options, "--lr", "1e-12", "--work-dir", work], timeout=600, cwd=REPO).stdout
    # Its dry run (given the cap) is what ran: the timing and the plan steps included.
    [executed] = assert_run_executed_its_dry_run(QUICKSTART, [*options, "--lr", "1e-12"], work)
    assert (
        "--no-save"
        in executed[
            executed.index("# plan: sizes and the estimate at the timed rates (quickstart.own_corpus_plan)") - 1
        ]
    )
    assert "bpe: learning 1000 joint merges" in output
    plan = next(line for line in output.splitlines() if "] plan: " in line)
    assert "300 training pairs" in plan and "1000 BPE merges" in plan
    assert "at most 40 updates of 2048 tokens per model" in plan and "(--max-update)" in plan
    assert "not improved for 3 epochs" in plan and "3+3 layers of width 128" in plan
    estimate = next(line for line in output.splitlines() if "] estimate: about " in line)
    assert "for 1 model(s), each training to the cap of 40 updates; the training updates" in estimate
    # The rate timed here: fairseq's updates per second over its log lines after the first
    # of the timing run, which ran 8 updates and saved nothing; the estimate is 40 of them. The
    # suite's commands run with OMP_NUM_THREADS=1, which fairseq-train inherits.
    timing_log = (work / "timing" / "softmax" / "train.log").read_text()
    speeds = [float(ups) for ups in re.findall(r"train_inner \|.*\bups=([\d.]+)", timing_log)]
    assert len(speeds) == 4 and "--no-save" in timing_log.splitlines()[0]
    assert not list((work / "timing").rglob("*.pt"))
    rate = sum(1 / ups for ups in speeds[1:]) / 3
    assert f"timed on this machine at 1 thread(s) (--threads): softmax {rate:.3f} s per update" in estimate
    assert f"about {format_seconds(40 * rate)} for 1 model(s)" in estimate
    # A cap below the passes the slowest measured model needed: said before training starts.
    warning = next(line for line in output.splitlines() if "] warning: the cap of 40 updates is below" in line)
    assert "--max-update" in warning
    assert output.index("] estimate: ") < output.index("] warning: ") < output.index("training (40 updates)")
    train_log = (work / "models" / "softmax-seed1" / "train.log").read_text()
    command = train_log.splitlines()[0].split()
    assert command[command.index("--max-update") + 1] == "40"
    assert command[command.index("--warmup-updates") + 1] == "10"  # at most a quarter of the updates
    assert command[command.index("--encoder-layers") + 1] == "3"
    assert command[command.index("--patience") + 1] == "3"
    assert command[command.index("--best-checkpoint-metric") + 1] == "accuracy"
    assert "early stop since valid performance hasn't improved for last 3 runs" in train_log
    [row] = json.loads((work / "results.json").read_text())
    assert row["model"] == "softmax" and row["stopped_early"] is True and row["epochs"] == 4
    assert row["updates"] < 40 and Path(row["checkpoint"]).name == "checkpoint_best.pt"
    table_row = next(line for line in output.splitlines() if line.startswith("| softmax "))
    assert [cell.strip() for cell in table_row.split("|")[-3:-1]] == [
        f"{row['updates']} ({row['best_update']})",
        "patience",
    ]
    assert "Every model stopped on the patience" in output and "compares unconverged models" not in output
    # Each model's own rate, beside the timed one, once it is trained.
    assert f"softmax [1/1]: {row['updates']} updates in " in output and f"(timed first updates: {rate:.2f})" in output
    # A rerun neither times nor trains the trained model again: nothing is left to estimate.
    again = run([*QUICKSTART, *options, "--lr", "1e-12", "--work-dir", work], timeout=600, cwd=REPO).stdout
    assert "timing its first" not in again and "] plan: " not in again and "already trained" in again
    assert json.loads((work / "results.json").read_text()) == [row]
