"""The paper recipes (examples/translation/recipe.py): the smoke mode of every task end to end on
the real text in ../shared/data, skipping finished stages on a rerun; the settings tables against
the docs and the dry run; bad input stopped before any long work; checkpoint averaging against an
independent computation; the IWSLT14 recipe's choice among averages of epoch checkpoints."""

import dataclasses
import json
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from examples.translation import recipe, selection, tasks
from fairseq_entmax.pipeline import (
    attention_analysis,
    checkpoints,
    corpus,
    dataset,
    evaluation,
    markers,
    runner,
    tables,
    tokenization,
    tools,
    training,
)
from helpers import assert_run_executed_its_dry_run, run, run_main

# Every test here trains through fairseq-train or runs a fairseq command, a recipe or the quickstart.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
# As the docs run it, from the repository root (cwd=REPO).
RECIPE = (sys.executable, "-m", "examples.translation.recipe")
SHARED_DATA = REPO.parent / "shared" / "data"
# The smoke run trains the baseline and learned alpha for 100 updates (two validations and two
# checkpoints to average): every stage runs, at two thirds of the default's models and half its
# updates; the dry-run tests check the default's three.
NORMALIZERS = ("softmax", "alpha_entmax")
SMOKE_OPTIONS = ("--models", *NORMALIZERS, "--max-update", "100")


needs_shared_data = pytest.mark.requires(
    (SHARED_DATA / "iwslt16_de_en_sample" / "train.de").exists(),
    f"the smoke mode reads real text from {SHARED_DATA}, which is absent here",
)


@pytest.fixture(scope="module")
def iwslt_smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp("iwslt17_smoke") / "work"
    proc = run(
        [*RECIPE, "iwslt17", "--smoke", *SMOKE_OPTIONS, "--work-dir", work, "--average-last", "2"],
        timeout=1200,
        cwd=REPO,
    )
    return work, proc.stdout + proc.stderr


@needs_shared_data
def test_iwslt17_smoke_runs_every_stage(iwslt_smoke):
    work, output = iwslt_smoke
    rows = json.loads((work / "results-seed1.json").read_text())
    best = {row["model"]: row for row in rows if row["selection"] == "best"}
    averaged = {row["model"]: row for row in rows if row["selection"] == "average"}
    assert set(best) == set(averaged) == set(NORMALIZERS)
    # The smoke test set is the first 200 lines of TED tst2014.
    references = (SHARED_DATA / "iwslt16_de_en_sample" / "test.en").read_text(encoding="utf-8").split("\n")[:200]
    assert corpus.read_lines(work / "raw" / "test.en") == [r.strip() for r in references]
    for normalizer, row in best.items():
        # The checkpoint of the best validation accuracy, as the paper selects models.
        assert Path(row["checkpoint"]).name == "checkpoint_best.pt" and Path(row["checkpoint"]).exists()
        logged = [
            float(a)
            for a in re.findall(
                r"valid on 'valid' subset \|.*\| accuracy ([\d.]+)",
                (work / "models" / f"{normalizer}-seed1" / "train.log").read_text(),
            )
        ]
        saved = torch.load(row["checkpoint"], map_location="cpu", weights_only=False)["extra_state"]
        assert len(logged) >= 2 and saved["best"] == pytest.approx(max(logged), abs=1e-3)
        hypotheses = corpus.read_lines(work / "eval" / f"{normalizer}-seed1-best" / "test.hyp")
        assert len(hypotheses) == 200
        assert "tok:none" in row["bleu_tok_signature"] and "tok:13a" in row["bleu_signature"]
        assert 0 <= row["bleu_tok"] <= 100 and 0 <= row["bleu"] <= 100 and 0 <= row["chrf"] <= 100
        assert row["train_seconds"] > 0
        assert set(row["density"]) == {"encoder_self", "decoder_self", "cross"}
        # The average of the last 2 checkpoints is an option, evaluated and reported apart.
        assert Path(averaged[normalizer]["checkpoint"]).name == "checkpoint_avg2.pt"
        assert len(corpus.read_lines(work / "eval" / f"{normalizer}-seed1-average" / "test.hyp")) == 200
    assert "Average of the last 2 checkpoints" in output and "| softmax (avg 2) " in output
    # Joint BPE: one codes file, one joined dictionary for both languages.
    assert (work / "bpe" / "codes").exists()
    assert (work / "data-bin" / "dict.de.txt").read_text() == (work / "data-bin" / "dict.en.txt").read_text()
    assert "tok BLEU" in output and "| alpha_entmax " in output


def _assert_the_run_executed_its_dry_run(options, work):
    """The first run in `work` executed exactly the lines its dry run prints, on the CPU."""
    runs = assert_run_executed_its_dry_run(RECIPE, options, work)
    assert all(" --cpu" in line for line in runs[0] if line.split()[0].endswith(("fairseq-train", "fairseq-generate")))
    return runs


@needs_shared_data
def test_iwslt17_smoke_executes_exactly_its_dry_run(iwslt_smoke):
    """Every command the run started (fairseq's, subword-nmt's, the analysis), each Python step
    in between, in order, is a line of the dry run, and nothing else ran."""
    work, _ = iwslt_smoke
    executed = _assert_the_run_executed_its_dry_run(
        ["iwslt17", "--smoke", *SMOKE_OPTIONS, "--average-last", "2"], work
    )[0]
    assert sum(line.split()[0].endswith("fairseq-train") for line in executed) == len(NORMALIZERS)
    assert sum(line.split()[0].endswith("fairseq-generate") for line in executed) == 2 * len(NORMALIZERS)


@needs_shared_data
def test_iwslt17_smoke_rerun_skips_finished_stages(iwslt_smoke):
    work, _ = iwslt_smoke
    stamp = (work / "data-bin" / "preprocess.done").stat().st_mtime
    proc = run_main([*RECIPE, "iwslt17", "--smoke", *SMOKE_OPTIONS, "--work-dir", work])
    for normalizer in NORMALIZERS:
        assert f"{normalizer} [" in proc.stdout and "already trained" in proc.stdout
    assert "tokenize:" not in proc.stdout and "training (" not in proc.stdout
    assert (work / "data-bin" / "preprocess.done").stat().st_mtime == stamp
    # The rerun ran no command: no tool, and the analysis of the same checkpoints was reused.
    rerun = assert_run_executed_its_dry_run(
        RECIPE, ["iwslt17", "--smoke", *SMOKE_OPTIONS, "--average-last", "2"], work
    )[-1]
    assert rerun and all(line.startswith("# ") for line in rerun), rerun


@needs_shared_data
def test_iwslt17_smoke_rerun_with_other_settings_is_refused(iwslt_smoke):
    """The models in the work dir were trained for 100 updates: a run asking for 7 stops
    with the reason instead of reporting them as 7-update models."""
    work, _ = iwslt_smoke
    proc = run_main(
        [*RECIPE, "iwslt17", "--smoke", "--models", *NORMALIZERS, "--work-dir", work, "--max-update", "7"], check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "max_update: 100 then, 7 now" in proc.stderr and "another --work-dir" in proc.stderr
    assert "training (" not in proc.stdout and "Traceback" not in proc.stderr


@needs_shared_data
def test_iwslt17_smoke_rerun_with_other_data_is_refused(iwslt_smoke, tmp_path):
    """The work dir's corpus came from the shared data: a run pointed at other data stops
    instead of training on the old corpus."""
    work, _ = iwslt_smoke
    proc = run_main(
        [*RECIPE, "iwslt17", "--smoke", *SMOKE_OPTIONS, "--work-dir", work, "--shared-data", tmp_path], check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{tmp_path}" in proc.stderr and "another --work-dir" in proc.stderr and "Traceback" not in proc.stderr


def test_a_model_trained_before_a_setting_existed_is_that_settings_default(tmp_path):
    """A finished model whose marker predates a TrainSettings field (and records its normalizer
    as "variant", as markers once did) is reused when the run asks for that field's default
    (the command it was trained with), and refused otherwise."""
    settings = training.TrainSettings(arch="adaptively_sparse_transformer", max_update=100)
    recorded = {"variant": "softmax", "seed": 1, **dataclasses.asdict(settings)}
    del recorded["share_all_embeddings"], recorded["max_epoch"]
    save_dir = tmp_path / "softmax-seed1"
    markers.mark_done(save_dir / "train.started", settings=recorded)
    markers.mark_done(save_dir / "train.done", {"seconds": 12.0})
    assert training.train("data-bin", save_dir, "softmax", settings) == 12.0
    unshared = dataclasses.replace(settings, share_all_embeddings=False)
    with pytest.raises(tools.PipelineError, match="share_all_embeddings: True then, False now"):
        training.train("data-bin", save_dir, "softmax", unshared)


def test_training_time_is_on_disk_while_the_model_trains(tmp_path, monkeypatch):
    """A training killed with no chance to clean up (a SIGKILL at a job's time limit) still
    leaves the time it spent, to which its resumed run adds."""
    save_dir = tmp_path / "softmax-seed1"
    on_disk = []

    def fake_run_logged(args, log_path, show=None, threads=None):
        time.sleep(0.05)
        show("epoch 001 | loss 5.1 | num_updates 50")
        on_disk.append(float((save_dir / "train_seconds.txt").read_text()))

    monkeypatch.setattr(training, "run_logged", fake_run_logged)
    settings = training.TrainSettings(arch="adaptively_sparse_transformer", max_update=100)
    save_dir.mkdir()
    (save_dir / "train_seconds.txt").write_text("30.0\n")  # an earlier, interrupted run
    seconds = training.train("data-bin", save_dir, "softmax", settings)
    assert on_disk[0] >= 30.05 and seconds >= on_disk[0]


def _write_corpus(directory, lines=None, skip=()):
    directory.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            if (split, lang) not in skip:
                text = lines[(split, lang)] if lines and (split, lang) in lines else "ein Satz .\nnoch einer .\n"
                (directory / f"{split}.{lang}").write_text(text, encoding="utf-8")
    return directory


@pytest.mark.parametrize("case", ["missing_file", "line_mismatch", "empty_corpus"])
def test_recipe_rejects_bad_corpus_before_long_work(tmp_path, case):
    if case == "missing_file":
        raw = _write_corpus(tmp_path / "raw", skip={("test", "en")})
        expected = str(tmp_path / "raw" / "test.en")
    elif case == "line_mismatch":
        raw = _write_corpus(tmp_path / "raw", lines={("valid", "en"): "one line only\n"})
        expected = "valid.de has 2 lines but"
    else:
        raw = _write_corpus(
            tmp_path / "raw", lines={(split, lang): "" for split in ("train", "valid", "test") for lang in ("de", "en")}
        )
        expected = "empty"
    work = tmp_path / "work"
    # --cpu: on this machine without CUDA the full recipe would stop before reading the corpus.
    proc = run_main([*RECIPE, "iwslt17", "--raw-dir", raw, "--work-dir", work, "--cpu"], check=False)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not (work / "tok").exists() and not (work / "data-bin").exists()


def test_recipe_rejects_unknown_language_pair_and_task(tmp_path):
    proc = run(
        [*RECIPE, "wmt16", "--src", "fr", "--tgt", "en", "--work-dir", tmp_path / "w"],
        check=False,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 2
    assert "unknown language pair fr-en" in proc.stderr and "--src ro --tgt en" in proc.stderr
    assert not (tmp_path / "w").exists()
    proc = run([*RECIPE, "iwslt15"], check=False, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and "invalid choice: 'iwslt15'" in proc.stderr


def test_recipe_reports_missing_smoke_data(tmp_path):
    proc = run_main(
        [*RECIPE, "kftt", "--smoke", "--shared-data", tmp_path / "nowhere", "--work-dir", tmp_path / "w"], check=False
    )
    assert proc.returncode == 2 and "smoke data" in proc.stderr and "nowhere" in proc.stderr


def test_average_checkpoints_is_the_mean_of_the_parameters(tmp_path):
    """Against the mean computed here; the last checkpoint's other fields are kept."""
    generator = torch.Generator().manual_seed(0)
    paths, params = [], []
    for i in range(3):
        model = {
            "w": torch.randn(4, 3, generator=generator),
            "b": torch.randn(3, generator=generator),
            "steps": torch.tensor(i),
        }
        state = {"model": model, "optimizer_history": [{"num_updates": 10 * (i + 1)}], "cfg": {"i": i}}
        path = tmp_path / f"checkpoint{i + 1}.pt"
        torch.save(state, path)
        paths.append(path)
        params.append(model)
    out = tmp_path / "avg.pt"
    checkpoints.average_checkpoints(paths, out)
    averaged = torch.load(out, weights_only=False)
    for key in ("w", "b"):
        torch.testing.assert_close(averaged["model"][key], torch.stack([p[key] for p in params]).mean(0))
    assert averaged["model"]["steps"].item() == 2 and averaged["cfg"] == {"i": 2}


def test_last_checkpoints_include_the_final_state_after_the_last_epoch_checkpoint(tmp_path):
    """fairseq stops at --max-update mid-epoch: that state is only in checkpoint_last.pt."""
    for name, updates in (
        ("checkpoint1.pt", 77),
        ("checkpoint2.pt", 154),
        ("checkpoint3.pt", 231),
        ("checkpoint_last.pt", 260),
    ):
        torch.save({"model": {}, "optimizer_history": [{"num_updates": updates}]}, tmp_path / name)
    assert [p.name for p in checkpoints.last_checkpoints(tmp_path, 3)] == [
        "checkpoint2.pt",
        "checkpoint3.pt",
        "checkpoint_last.pt",
    ]
    torch.save({"model": {}, "optimizer_history": [{"num_updates": 231}]}, tmp_path / "checkpoint_last.pt")
    assert [p.name for p in checkpoints.last_checkpoints(tmp_path, 3)] == [
        "checkpoint1.pt",
        "checkpoint2.pt",
        "checkpoint3.pt",
    ]


def test_pipeline_names_the_attention_types_of_the_fairseq_layer():
    """The pipeline's tables and log lines are keyed by the fairseq layer's attention types,
    which it imports from fairseq_entmax.names where it uses them: it keeps no copy."""
    from fairseq_entmax.names import ATTENTION_TYPES

    assert not hasattr(training, "ATTENTION_TYPES")
    header = tables.format_table([]).splitlines()[0]
    assert header.count("| density ") == len(ATTENTION_TYPES)


@pytest.mark.parametrize("lang", ["ja", "zh"])
def test_bleu_of_a_character_segmented_target_is_not_zero(tmp_path, lang):
    """sacreBLEU's default tokenizer leaves a Japanese or Chinese sentence as one token:
    BLEU read 0 for a translation with one character wrong. Scored as the recipes do:
    Moses-tokenised (characters split) hypotheses, detokenised against the raw references."""
    references = {"ja": ["今日は良い天気です。", "私は学生です。"], "zh": ["今天天气很好。", "我是学生。"]}[lang]
    hypotheses = [references[0], references[1].replace("学", "先")]

    def tokenized(lines, name):
        raw = tmp_path / f"{name}.txt"
        raw.write_text("\n".join(lines) + "\n", encoding="utf-8")
        tokenization.tokenize_file(raw, tmp_path / f"{name}.tok", lang)
        return corpus.read_lines(tmp_path / f"{name}.tok")

    references_tok, hypotheses_tok = tokenized(references, "ref"), tokenized(hypotheses, "hyp")
    perfect = evaluation.score(references_tok, references_tok, references, lang)
    assert perfect["bleu"] == 100.0 and perfect["bleu_tok"] == 100.0
    one_wrong = evaluation.score(hypotheses_tok, references_tok, references, lang)
    assert 40.0 < one_wrong["bleu"] < 100.0
    assert f"tok:{tokenization.SACREBLEU_TOKENIZER[lang]}" in one_wrong["bleu_signature"]


def test_read_lines_keeps_alignment_with_unicode_separators(tmp_path):
    path = tmp_path / "text"
    path.write_text("eins\u2028zwei\nline two\r\n", encoding="utf-8")
    assert corpus.read_lines(path) == ["eins\u2028zwei", "line two "]
    assert corpus.count_lines(path) == 2


def test_results_of_several_seeds_give_each_normalizers_difference_to_softmax(tmp_path, capsys):
    """--seed 1 2: the report pairs each normalizer with softmax of the same seed, in every score."""
    args = recipe.parse_args(["iwslt17", "--smoke", "--seed", "1", "2", "--work-dir", str(tmp_path)])
    plan = recipe.Plan(args, recipe.experiment_settings(args, 1, cpu=True), 1, True)
    bleu = {("softmax", 1): 20.0, ("alpha_entmax", 1): 21.0, ("softmax", 2): 22.0, ("alpha_entmax", 2): 22.0}
    plan.rows = [
        {"model": model, "seed": seed, "selection": "best", "bleu": value, "bleu_tok": value + 1, "chrf": 2 * value}
        | {"best_valid_accuracy": 50.0, "train_seconds": 60.0, "bleu_tok_signature": "tok", "bleu_signature": "b"}
        | {"chrf_signature": "c"}
        for (model, seed), value in bleu.items()
    ]
    plan.counts = {"train": 3, "valid": 2, "test": 2}
    recipe.write_results(args, plan, started=0.0)
    report = (tmp_path / "results-seed1-2.md").read_text()
    assert report in capsys.readouterr().out
    # BLEU differences 1 and 0: mean 0.5 ± t(0.975, 1) 12.706 x sd 0.707 / sqrt(2) = 0.5 ± 6.35; chrF twice that.
    assert "| alpha_entmax | 1, 2 | +0.50 [-5.85, +6.85] | +0.50 [-5.85, +6.85] | +1.00 [-11.71, +13.71] " in report
    assert "| +0.00 [+0.00, +0.00] |" in report and "Difference to softmax of the same seed" in report
    rows = [row for row in plan.rows if row["seed"] == 1]
    args = recipe.parse_args(["iwslt17", "--smoke", "--seed", "1", "--work-dir", str(tmp_path)])
    plan = recipe.Plan(args, recipe.experiment_settings(args, 1, cpu=True), 1, True)
    plan.rows, plan.counts = rows, {"train": 3, "valid": 2, "test": 2}
    recipe.write_results(args, plan, started=0.0)
    assert "Difference to softmax" not in (tmp_path / "results-seed1.md").read_text()


def test_first_lines_of_a_corpus_keep_the_alignment_and_leave_the_same_text_alone(tmp_path):
    """The smaller corpus of the reproduction's budgets and of the convergence sizes."""
    source = tmp_path / "corpus"
    source.mkdir()
    files = {}
    for split in corpus.SPLITS:
        for lang in ("de", "en"):
            (source / f"{split}.{lang}").write_text("".join(f"{split} {lang} {i}\u2028x\n" for i in range(5)))
        files[split] = (source / f"{split}.de", source / f"{split}.en")
    into = tmp_path / "small"
    corpus.write_first_lines(files, {"train": 3, "test": None}, into)
    assert corpus.check_parallel_corpus({s: (into / f"{s}.de", into / f"{s}.en") for s in corpus.SPLITS}) == {
        "train": 3,
        "valid": 5,
        "test": 5,
    }
    assert corpus.read_lines(into / "train.en") == [f"train en {i}\u2028x" for i in range(3)]
    written = (into / "valid.de").stat().st_mtime_ns
    corpus.write_first_lines(files, {"train": 2}, into)
    assert (into / "valid.de").stat().st_mtime_ns == written and corpus.count_lines(into / "train.de") == 2


def test_checkpoint_last_cut_short_by_an_interrupt_is_replaced_by_the_newest_complete_one(tmp_path):
    torch.save({"num_updates": 10}, tmp_path / "checkpoint1.pt")
    torch.save({"num_updates": 20}, tmp_path / "checkpoint2.pt")
    complete = (tmp_path / "checkpoint2.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(complete[: len(complete) // 2])

    training._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert torch.load(tmp_path / "checkpoint_last.pt")["num_updates"] == 20


def test_checkpoint_last_cut_short_with_nothing_complete_is_removed(tmp_path):
    torch.save({"num_updates": 10}, tmp_path / "checkpoint_last.pt")
    complete = (tmp_path / "checkpoint_last.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(complete[:-30])

    training._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_complete_checkpoint_last_is_left_alone(tmp_path):
    torch.save({"num_updates": 30}, tmp_path / "checkpoint_last.pt")
    torch.save({"num_updates": 20}, tmp_path / "checkpoint2.pt")
    before = (tmp_path / "checkpoint_last.pt").read_bytes()

    training._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before


def _fake_tool_run(calls, write_output):
    """A stand-in for tools.run_logged that records each command and writes its output."""

    def run_logged(args, log_path, **kwargs):
        calls.append(args)
        write_output(args, len(calls))

    return run_logged


def test_translations_of_a_changed_checkpoint_are_made_again(tmp_path, monkeypatch):
    def write_output(args, count):
        results = Path(args[args.index("--results-path") + 1])
        (results / "generate-test.txt").write_text(f"H-0\t-0.1\ttranslation {count}\n")

    calls = []
    monkeypatch.setattr(evaluation, "run_logged", _fake_tool_run(calls, write_output))
    checkpoint = tmp_path / "checkpoint_last.pt"
    checkpoint.write_bytes(b"the first model")
    out = tmp_path / "eval"
    translation = evaluation.Translation("data-bin", checkpoint, "test", out)
    assert translation.run() == ["translation 1"]
    assert translation.run() == ["translation 1"]
    assert len(calls) == 1, "the finished translation was not reused"
    checkpoint.write_bytes(b"a model trained again")  # e.g. its folder deleted and retrained
    assert translation.run() == ["translation 2"]
    assert dataclasses.replace(translation, decoding=evaluation.Decoding(beam=2)).run() == ["translation 3"]


def test_analysis_is_reused_only_for_the_same_checkpoints(tmp_path, monkeypatch):
    """A second seed's models, though named as the first's, get their own analysis."""

    def write_output(args, count):
        out = Path(args[args.index("--output-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        paths = [a for i, a in enumerate(args) if args[i - 1] == "--path"]
        models = [
            {
                "name": "softmax",
                "path": str(p),
                "density": [{"attention": "cross", "fraction": count / 10}],
                "alpha": [],
                "js": [],
            }
            for p in paths
        ]
        (out / "analysis.json").write_text(json.dumps({"models": models}))

    calls = []
    monkeypatch.setattr(attention_analysis, "run_logged", _fake_tool_run(calls, write_output))
    seed1, seed2 = tmp_path / "softmax-seed1.pt", tmp_path / "softmax-seed2.pt"
    seed1.write_bytes(b"seed 1")
    seed2.write_bytes(b"seed 2")
    out = tmp_path / "analysis"
    first = attention_analysis.analyze("data-bin", {"softmax": seed1}, "test", out, tmp_path / "analysis.log")
    again = attention_analysis.analyze("data-bin", {"softmax": seed1}, "test", out, tmp_path / "analysis.log")
    assert first == again and len(calls) == 1
    other = attention_analysis.analyze("data-bin", {"softmax": seed2}, "test", out, tmp_path / "analysis.log")
    assert len(calls) == 2 and other["softmax"]["density"]["cross"] == pytest.approx(0.2)


def test_threads_reach_fairseq_generate_and_the_analysis(tmp_path, monkeypatch):
    """--threads limits translation and analysis as it does training: at torch's default they
    would compete for the cores of a machine the user shares (docs/recipes.md measures it)."""
    seen = []

    def run_logged(args, log_path, threads=None, **kwargs):
        seen.append(threads)
        if "--results-path" in args:
            (Path(args[args.index("--results-path") + 1]) / "generate-test.txt").write_text("H-0\t-0.1\tyes\n")
        else:
            out = Path(args[args.index("--output-dir") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / "analysis.json").write_text(json.dumps({"models": []}))

    monkeypatch.setattr(evaluation, "run_logged", run_logged)
    monkeypatch.setattr(attention_analysis, "run_logged", run_logged)
    checkpoint = tmp_path / "checkpoint_best.pt"
    checkpoint.write_bytes(b"a model")
    for threads, out in ((1, "one"), (None, "default")):
        evaluation.Translation("data-bin", checkpoint, "test", tmp_path / out).run(threads=threads)
        attention_analysis.analyze(
            "data-bin", {}, "test", tmp_path / out / "analysis", tmp_path / "a.log", threads=threads
        )
    assert seen == [1, 1, None, None]


def test_binarize_resumes_after_an_interrupted_fairseq_preprocess(tmp_path):
    """An interrupt can leave the dictionaries in the destination, which fairseq-preprocess
    then refuses to overwrite."""
    text = _write_corpus(tmp_path / "text")
    steps, _, data_bin = dataset.dataset_steps(text, "de", "en", tmp_path / "work", 20, tokenize=False, clean=None)
    data_bin.mkdir(parents=True)
    (data_bin / "dict.de.txt").write_text("ein 1\n")
    runner.run_steps(steps)
    assert (data_bin / "train.de-en.de.bin").exists()
    assert "Satz 2" in (data_bin / "dict.de.txt").read_text()


def test_a_failing_tool_is_reported_with_its_log_and_exit_status_1(tmp_path, capsys):
    log_path = tmp_path / "tool.log"
    failing_tool = [sys.executable, "-c", "import sys; print('out of memory'); sys.exit(3)"]
    status = tools.run_reporting_errors(lambda args: tools.run_logged(failing_tool, log_path), None)
    error = capsys.readouterr().err
    assert status == 1
    assert "failed (exit 3)" in error and "out of memory" in error and str(log_path) in error


# --------------------------------------------------------------------------- the settings of record


def _block(text, start, end):
    return text[text.index(start) + len(start) : text.index(end)].strip()


def test_docs_show_the_settings_table_and_the_departures_of_the_code():
    """docs/recipes.md shows the one settings table (value and source of each setting) and the
    list of departures; the page and tasks.py must not drift apart."""
    docs = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert _block(docs, "<!-- settings-table -->", "<!-- /settings-table -->") == tasks.CORREIA.settings_table()
    assert _block(docs, "<!-- departures-table -->", "<!-- /departures-table -->") == tasks.CORREIA.departures_table()


def _dry_run(*options, check=True):
    return run_main([*RECIPE, *options, "--dry-run"], check=check)


def _option(command, name, default=None):
    words = command.split()
    return words[words.index(name) + 1] if name in words else default


def test_dry_run_keeps_the_checkpoints_that_average_last_averages(tmp_path):
    """--average-last N beyond the checkpoints the task keeps: the training the dry run prints
    keeps N, as the run trains, and the average is translated."""
    output = _dry_run("iwslt17", "--average-last", "8", "--seed", "1", "--work-dir", tmp_path / "w").stdout
    train = _commands(output, "fairseq-train")
    assert len(train) == 3 and all(_option(c, "--keep-interval-updates") == "8" for c in train)
    generate = _commands(output, "fairseq-generate")
    assert (
        sorted(Path(_option(c, "--path")).name for c in generate)
        == ["checkpoint_avg8.pt"] * 3 + ["checkpoint_best.pt"] * 3
    )


@pytest.mark.parametrize("task,interval", [("iwslt17", 5000), ("kftt", 5000), ("wmt16", 10000), ("wmt14", 10000)])
def test_dry_run_trains_with_the_settings_of_the_table(tmp_path, task, interval):
    proc = _dry_run(task, "--work-dir", tmp_path / "work")
    lines = proc.stdout.splitlines()
    train = [line for line in lines if line.split()[0].endswith("fairseq-train")]
    # The paper's Table 1 normalizers, top-k only on request.
    assert [_option(c, "--attention-normalizer") for c in train] == ["softmax", "entmax15", "alpha_entmax"]
    recipe = tasks.RECIPE
    for command in train:
        assert "--encoder-normalize-before" in command and "--decoder-normalize-before" in command
        assert float(_option(command, "--dropout")) == recipe["dropout"].value
        assert float(_option(command, "--attention-dropout")) == recipe["attention_dropout"].value
        assert float(_option(command, "--activation-dropout")) == recipe["activation_dropout"].value
        assert "--adam-betas '(0.9, 0.998)'" in command and float(_option(command, "--adam-eps")) == 1e-9
        assert float(_option(command, "--weight-decay")) == 0.0
        assert int(_option(command, "--warmup-updates")) == 20000
        assert float(_option(command, "--lr")) == pytest.approx(2 / (512 * 20000) ** 0.5)
        assert (
            _option(command, "--best-checkpoint-metric") == "accuracy"
            and "--maximize-best-checkpoint-metric" in command
        )
        assert int(_option(command, "--patience")) == 3
        # Validation only at the paper's interval: the epoch-end validations are out of reach.
        assert int(_option(command, "--validate-interval-updates")) == interval
        assert int(_option(command, "--save-interval-updates")) == interval
        assert int(_option(command, "--validate-interval")) >= 1_000_000
    generate = [line for line in lines if line.split()[0].endswith("fairseq-generate")]
    assert len(generate) == 3 and all("checkpoint_best.pt" in c for c in generate)
    assert all(_option(c, "--beam") == "5" and float(_option(c, "--lenpen")) == 0.0 for c in generate)
    [preprocess] = [line for line in lines if line.split()[0].endswith("fairseq-preprocess")]
    # Joint BPE, one dictionary, one embedding matrix.
    assert "--joined-dictionary" in preprocess and all("--share-all-embeddings" in c for c in train)
    analysis = [line for line in lines if line.split()[0].endswith("fairseq-entmax-analyze")]
    assert len(analysis) == 1 and _option(analysis[0], "--subset") == "valid" and "--num-sentences" not in analysis[0]
    # Nothing was run or written.
    assert not (tmp_path / "work").exists()
    topk = _dry_run(task, "--models", "topk", "--work-dir", tmp_path / "work").stdout
    assert [_option(line, "--topk") for line in topk.splitlines() if "fairseq-train" in line.split()[0]] == ["8"]


@pytest.mark.parametrize(
    "gpus,options",
    [
        (1, []),
        (2, []),
        (4, []),
        (8, []),
        (1, ["--max-tokens", "2048"]),
        (2, ["--update-freq", "2"]),
        (4, ["--max-tokens", "1024"]),
    ],
)
def test_dry_run_gives_8192_tokens_per_update_on_any_number_of_gpus(tmp_path, gpus, options):
    proc = _dry_run("iwslt17", "--num-gpus", str(gpus), *options, "--work-dir", tmp_path / "w")
    train = [line for line in proc.stdout.splitlines() if line.split()[0].endswith("fairseq-train")]
    assert len(train) == 3
    for command in train:
        world = int(_option(command, "--distributed-world-size", 1))
        assert world == gpus
        assert int(_option(command, "--max-tokens")) * int(_option(command, "--update-freq")) * world == 8192


def test_dry_run_refuses_a_batch_that_is_not_8192_tokens(tmp_path):
    proc = _dry_run("iwslt17", "--num-gpus", "3", "--work-dir", tmp_path / "w", check=False)
    assert proc.returncode == 2 and "8192 tokens per update" in proc.stderr and "Traceback" not in proc.stderr
    proc = _dry_run("iwslt17", "--max-tokens", "3000", "--work-dir", tmp_path / "w", check=False)
    assert proc.returncode == 2 and "--max-tokens 4096 --update-freq 2" in proc.stderr
    proc = run_main([*RECIPE, "iwslt17", "--num-gpus", "2"], check=False)
    assert proc.returncode == 2 and "--num-gpus plans a --dry-run" in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_full_recipe_without_cuda_stops_before_any_download(tmp_path):
    proc = run([*RECIPE, "wmt14", "--work-dir", tmp_path / "work"], check=False, timeout=120, cwd=REPO)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr and "--cpu" in proc.stderr and "--smoke" in proc.stderr
    assert "Traceback" not in proc.stderr and "downloading" not in proc.stdout
    assert not (tmp_path / "work").exists()


def test_tokenized_bleu_does_not_split_hyphens():
    """Training text is split at hyphens (Moses -a), scoring text is not: -a turns a hyphenated
    word into several tokens, and a compound translated right then counts as many matching
    n-grams, raising BLEU as compound splitting does."""
    hypotheses_raw = ["this state-of-the-art system is fast ."]
    references_raw = ["this state-of-the-art model is fast ."]
    tokenization._init_tokenizer("en")
    hypotheses_tok = [tokenization._tokenize_line(line) for line in hypotheses_raw]
    references_tok = [tokenization._tokenize_line(line) for line in references_raw]
    assert "state @-@ of @-@ the @-@ art" in hypotheses_tok[0]
    assert tokenization.scoring_tokenize(references_raw, "en") == references_raw
    split = evaluation.score(hypotheses_tok, references_tok, references_raw, "en")
    unsplit = evaluation.score(hypotheses_tok, references_tok, references_raw, "en", retokenize=True)
    assert unsplit["bleu_tok"] < split["bleu_tok"]
    perfect = evaluation.score(references_tok, references_tok, references_raw, "en", retokenize=True)
    assert perfect["bleu_tok"] == 100.0


@needs_shared_data
@pytest.mark.parametrize(
    "task,src,tgt,data_only",
    [("kftt", "ja", "en", True), ("wmt16", "ro", "en", True), ("wmt14", "en", "de", False)],
)
def test_smoke_mode_of_every_task_runs_end_to_end(tmp_path, task, src, tgt, data_only):
    """Each task's data path (iwslt17 runs every stage in full above): its shared text prepared,
    tokenised, BPE'd and binarised, with --data-only stopping there; without it (wmt14, a German
    target) a model trained a few updates and the test set translated and scored."""
    work = tmp_path / "work"
    proc = run(
        [*RECIPE, task, "--smoke", "--work-dir", work, "--models", "alpha_entmax", "--max-update", "6"]
        + ["--skip-analysis", *(["--data-only"] if data_only else [])],
        timeout=900,
        cwd=REPO,
    )
    test_lines = corpus.read_lines(work / "raw" / f"test.{tgt}")
    assert len(test_lines) == 200 and len(corpus.read_lines(work / "raw" / f"test.{src}")) == 200
    assert (work / "data-bin" / f"dict.{src}.txt").read_text() == (work / "data-bin" / f"dict.{tgt}.txt").read_text()
    assert (work / "data-bin" / f"test.{src}-{tgt}.{tgt}.bin").stat().st_size > 0
    if data_only:
        assert f"data-bin ready: {work / 'data-bin'}" in proc.stdout
        assert not (work / "models").exists() and not list(work.glob("results*"))
    else:
        [row] = json.loads((work / "results-seed1.json").read_text())
        assert row["model"] == "alpha_entmax" and row["selection"] == "best"
        assert len(corpus.read_lines(work / "eval" / "alpha_entmax-seed1-best" / "test.hyp")) == 200
        assert 0 <= row["bleu_tok"] <= 100 and 0 <= row["chrf"] <= 100
    if task == "wmt16":
        # The Romanian side is normalised as wmt16-scripts do: no diacritics left.
        romanian = "".join(corpus.read_lines(work / "raw" / "train.ro"))
        assert romanian and not set("ăâîșțşţĂÂÎȘȚŞŢ") & set(romanian)


def test_dry_run_of_data_only_stops_after_binarize(tmp_path):
    output = _dry_run("wmt14", "--data-only", "--work-dir", tmp_path / "work").stdout
    assert len(_commands(output, "fairseq-preprocess")) == 1
    assert not _commands(output, "fairseq-train") and not _commands(output, "fairseq-generate")
    assert not _commands(output, "fairseq-entmax-analyze")


# --------------------------------------------------------------------------- IWSLT14 de-en (Zhao et al.)


def test_docs_show_the_iwslt14_settings_and_departures_of_the_code():
    docs = (REPO / "docs" / "recipes.md").read_text(encoding="utf-8")
    assert _block(docs, "<!-- iwslt14-settings-table -->", "<!-- /iwslt14-settings-table -->") == (
        tasks.EST.settings_table()
    )
    assert _block(docs, "<!-- iwslt14-departures-table -->", "<!-- /iwslt14-departures-table -->") == (
        tasks.EST.departures_table()
    )


def _commands(output, tool):
    return [line for line in output.splitlines() if line.split()[0].endswith(tool)]


def test_iwslt14_dry_run_trains_and_selects_as_the_authors_script(tmp_path):
    output = _dry_run("iwslt14", "--work-dir", tmp_path / "work").stdout
    train = _commands(output, "fairseq-train")
    # softmax and top-k, seeds 1-3, as the authors' script runs them.
    assert [(_option(c, "--attention-normalizer"), _option(c, "--seed")) for c in train] == [
        (normalizer, seed) for seed in "123" for normalizer in ("softmax", "topk")
    ]
    for command in train:
        assert _option(command, "--arch") == "explicit_sparse_transformer_iwslt_de_en"
        assert "--encoder-normalize-before" not in command and "--decoder-normalize-before" not in command
        assert float(_option(command, "--dropout")) == 0.4
        assert float(_option(command, "--attention-dropout")) == 0.0
        assert float(_option(command, "--lr")) == 1e-3 and _option(command, "--lr-scheduler") == "inverse_sqrt"
        assert int(_option(command, "--warmup-updates")) == 4000 and float(_option(command, "--warmup-init-lr")) == 1e-7
        assert float(_option(command, "--stop-min-lr")) == 1e-9
        assert "--adam-betas '(0.9, 0.98)'" in command and float(_option(command, "--weight-decay")) == 1e-4
        assert float(_option(command, "--clip-norm")) == 25.0
        assert float(_option(command, "--label-smoothing")) == 0.1
        assert int(_option(command, "--max-tokens")) == 4000 and int(_option(command, "--update-freq")) == 4
        assert int(_option(command, "--max-epoch")) == 90 and int(_option(command, "--max-update")) == 0
        assert int(_option(command, "--keep-last-epochs")) == 50 and "--save-interval-updates" not in command
        assert "--fp16" in command
        # Separate source, target and output embeddings, as the script trains.
        assert "--share-all-embeddings" not in command and "--share-decoder-input-output-embed" not in command
        if _option(command, "--attention-normalizer") == "topk":
            assert _option(command, "--topk") == "8"
    generate = _commands(output, "fairseq-generate")
    assert all(_option(c, "--beam") == "5" and "--remove-bpe" in c for c in generate)
    valid = [c for c in generate if _option(c, "--gen-subset") == "valid"]
    test = [c for c in generate if _option(c, "--gen-subset") == "test"]
    # Per model: the averages ending at epochs 50, 55, ..., 90 on valid, the selected one on test.
    assert [Path(_option(c, "--path")).name for c in valid[:9]] == [
        f"checkpoint_avg10_ep{end}.pt" for end in range(50, 91, 5)
    ]
    assert len(valid) == 9 * 6 and len(test) == 6
    assert all(Path(_option(c, "--path")).name == selection.SELECTED for c in test)
    assert "checkpoint{81..90}.pt" in output
    # prepare-iwslt14.sh's data: 10,000 merges; tokenising and cleaning are done when preparing.
    [learn] = [line for line in output.splitlines() if "learn-bpe" in line]
    assert _option(learn, "--symbols") == "10000"
    assert "# tokenize:" not in output and "drop training pairs" not in output
    # Binarised with a dictionary per language, as fairseq's IWSLT14 example.
    [preprocess] = _commands(output, "fairseq-preprocess")
    assert "--joined-dictionary" not in preprocess
    assert "dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz" in output
    assert not (tmp_path / "work").exists()
    baselines = _dry_run("iwslt14", "--models", "sparsemax", "entmax15", "--seed", "2", "--work-dir", tmp_path / "w")
    assert [_option(c, "--attention-normalizer") for c in _commands(baselines.stdout, "fairseq-train")] == [
        "sparsemax",
        "entmax15",
    ]


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
def test_iwslt14_dry_run_keeps_16000_tokens_per_update_on_any_number_of_gpus(tmp_path, gpus):
    output = _dry_run("iwslt14", "--num-gpus", str(gpus), "--seed", "1", "--work-dir", tmp_path / "w").stdout
    for command in _commands(output, "fairseq-train"):
        world = int(_option(command, "--distributed-world-size", 1))
        assert world == gpus
        assert int(_option(command, "--max-tokens")) * int(_option(command, "--update-freq")) * world == 16000
        # The authors' 4000 tokens per GPU where the GPUs allow it.
        assert int(_option(command, "--max-tokens")) == (4000 if gpus <= 4 else 2000)
    proc = _dry_run("iwslt14", "--num-gpus", "3", "--work-dir", tmp_path / "w", check=False)
    assert proc.returncode == 2 and "16000 tokens per update" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_full_iwslt14_recipe_without_cuda_stops_before_any_download(tmp_path):
    proc = run_main([*RECIPE, "iwslt14", "--work-dir", tmp_path / "work"], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA device" in proc.stderr and "transformer_iwslt_de_en" in proc.stderr
    assert "--cpu" in proc.stderr and "--smoke" in proc.stderr
    assert "Traceback" not in proc.stderr and "downloading" not in proc.stdout
    assert not (tmp_path / "work").exists()


def test_iwslt14_refuses_the_best_checkpoint_options(tmp_path):
    proc = run_main([*RECIPE, "iwslt14", "--dry-run", "--average-last", "5", "--work-dir", tmp_path / "w"], check=False)
    assert proc.returncode == 2 and "averages epoch checkpoints already" in proc.stderr


def _epoch_checkpoints(save_dir, epochs):
    """Fake epoch checkpoints: parameter w of epoch e is e (a float tensor)."""
    save_dir.mkdir(parents=True)
    for epoch in epochs:
        torch.save(
            {"model": {"w": torch.full((2,), float(epoch))}, "optimizer_history": [{"num_updates": 10 * epoch}]},
            save_dir / f"checkpoint{epoch}.pt",
        )


def test_iwslt14_selection_takes_the_average_of_the_best_validation_bleu(tmp_path, monkeypatch):
    """Against fake training and fake fairseq-generate runs whose validation BLEU is set per
    average: each average is the mean of its epochs, the best validation BLEU (the later epoch
    on a tie) is selected, and only the selected average translates the test set."""
    work = tmp_path / "work"
    _epoch_checkpoints(work / "models" / "topk-seed1", range(2, 11))  # epoch 1 was not kept
    valid_bleu = {4: 3.0, 6: 7.5, 8: 7.5, 10: 5.0}
    generated = []

    def fake_generate(args, log_path, **kwargs):
        checkpoint = Path(args[args.index("--path") + 1])
        subset, out = args[args.index("--gen-subset") + 1], Path(args[args.index("--results-path") + 1])
        averaged = torch.load(checkpoint, weights_only=False)["model"]["w"][0].item()
        generated.append((subset, checkpoint.resolve().name, averaged))
        end = int(checkpoint.resolve().stem.split("_ep")[1])
        bleu = valid_bleu[end] if subset == "valid" else 11.0
        (out / f"generate-{subset}.txt").write_text(
            f"H-1\t-0.5\tzwei\nH-0\t-0.1\teins\nGenerate {subset} with beam=5: BLEU4 = {bleu:.2f}, 50.0/9.1/1.0/0.1 "
            "(BP=1.000, ratio=1.000, syslen=2, reflen=2)\n"
        )

    monkeypatch.setattr(evaluation, "run_logged", fake_generate)
    row = _select_among_averages(work, "topk", (2, 4, 6, 8, 10), monkeypatch)
    # No average ends at epoch 2 (epoch 1 is missing); the others are the means of their epochs.
    assert [(subset, name) for subset, name, _ in generated if subset == "valid"] == [
        ("valid", f"checkpoint_avg2_ep{end}.pt") for end in (4, 6, 8, 10)
    ]
    assert all(value == pytest.approx(int(name.split("_ep")[1][:-3]) - 0.5) for _, name, value in generated)
    assert row["valid_bleu"] == valid_bleu and row["end_epoch"] == 8
    assert generated[-1][:2] == ("test", "checkpoint_avg2_ep8.pt") and len(generated) == 5
    selected = Path(row["checkpoint"])
    assert selected.name == selection.SELECTED and selected.resolve().name == "checkpoint_avg2_ep8.pt"
    assert row["bleu_tok"] == 11.0 and "case:lc" in row["bleu_signature"] and row["bleu"] == 0.0
    assert row["train_seconds"] == 12.0


def _select_among_averages(work, normalizer, ends, monkeypatch):
    """Run the IWSLT14 selection's steps of one model (averages of 2 epoch checkpoints ending at
    `ends`) over the checkpoints in `work`, its training faked (12 s). Returns its result row."""

    def train(data_bin, save_dir, *args, **kwargs):
        markers.mark_done(save_dir / "train.done", {"seconds": 12.0})

    monkeypatch.setattr(training, "train", train)
    layout = SimpleNamespace(
        work=work,
        data_bin=Path("data-bin"),
        references_raw=work / "test.orig.en",
        save_dir=lambda normalizer, seed: work / "models" / f"{normalizer}-seed{seed}",
    )
    plan = SimpleNamespace(
        layout=layout,
        settings=training.TrainSettings(arch="transformer", max_update=0),
        decoding=evaluation.DEFAULT_DECODING,
        cpu=True,
        smoke=False,
        tgt="en",
        rows=[],
        references=lambda: ([], ["One.", "Two."]),
    )
    averages = selection.EpochAverages(average=(2, ends), smoke_average=(2, ends))
    steps = averages.model_steps(plan, evaluation.Model(normalizer, 1, label=normalizer))
    runner.run_steps(steps)
    [row] = plan.rows
    return row


def test_iwslt14_selection_without_any_full_range_of_checkpoints_is_refused(tmp_path, monkeypatch):
    work = tmp_path / "work"
    _epoch_checkpoints(work / "models" / "softmax-seed1", [3])
    with pytest.raises(tools.PipelineError, match="no 2 consecutive epoch checkpoints ending at any of epochs 3, 4"):
        _select_among_averages(work, "softmax", (3, 4), monkeypatch)


@needs_shared_data
def test_iwslt14_smoke_runs_every_stage_and_selects_an_average(tmp_path):
    """The data prepared as prepare-iwslt14.sh (tokenised, cleaned, lowercased, every 23rd pair
    valid), a top-k model trained for 3 epochs, the averages of its last 2 epoch checkpoints
    ending at epochs 2 and 3 translating the validation set, the selected one the test set."""
    work = tmp_path / "work"
    options = ["iwslt14", "--smoke", "--seed", "1", "--models", "topk", "--skip-analysis"]
    run([*RECIPE, *options, "--work-dir", work], timeout=900, cwd=REPO)
    _assert_the_run_executed_its_dry_run(options, work)
    [row] = json.loads((work / "results-seed1.json").read_text())
    assert row["model"] == "topk" and row["selection"] == "average"
    assert set(row["valid_bleu"]) == {"2", "3"} and row["end_epoch"] in (2, 3)
    assert row["valid_bleu"][str(row["end_epoch"])] == max(row["valid_bleu"].values())
    save_dir = work / "models" / "topk-seed1"
    assert Path(row["checkpoint"]).resolve() == save_dir / f"checkpoint_avg2_ep{row['end_epoch']}.pt"
    assert 0 <= row["bleu_tok"] <= 100 and "case:lc" in row["bleu_signature"]
    # The test set: the first 10 lines of TED dev2010, TEDX dev2012 and TED tst2010, in that order.
    shared = SHARED_DATA / "iwslt16_de_en_sample" / "dev_test"
    references = [
        line.strip()
        for name in ("TED.dev2010", "TEDX.dev2012", "TED.tst2010")
        for line in (shared / f"IWSLT16.{name}.en").read_text(encoding="utf-8").split("\n")[:10]
    ]
    assert corpus.read_lines(work / "raw" / "test.orig.en") == references
    # Tokenised and lowercased as the training text, with prepare-iwslt14.sh's ’ -> '.
    expected = [line.lower() for line in tokenization.scoring_tokenize([r.replace("’", "'") for r in references], "en")]
    assert corpus.read_lines(work / "raw" / "test.en") == expected
    assert len(corpus.read_lines(work / "eval" / "topk-seed1-selected" / "test.hyp")) == 30
    # A dictionary per language, and the model's three embedding matrices apart.
    de, en = ((work / "data-bin" / f"dict.{lang}.txt").read_text(encoding="utf-8") for lang in ("de", "en"))
    assert de != en
    state = torch.load(save_dir / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    embeddings = [state[f"{side}.embed_tokens.weight"] for side in ("encoder", "decoder")]
    embeddings.append(state["decoder.output_projection.weight"])
    assert len({t.data_ptr() for t in embeddings}) == 3
    train_lines = corpus.read_lines(work / "raw" / "train.en")
    valid_lines = corpus.read_lines(work / "raw" / "valid.en")
    # Every 23rd of the cleaned pairs is a validation pair.
    assert len(valid_lines) == (len(train_lines) + len(valid_lines)) // 23
    assert all(line == line.lower() for line in train_lines + valid_lines)


def test_iwslt14_raw_dir_without_untokenised_test_references_is_refused(tmp_path):
    raw = _write_corpus(tmp_path / "raw")
    work = tmp_path / "work"
    # --cpu: on this machine without CUDA the full recipe would stop before reading the corpus.
    proc = run_main([*RECIPE, "iwslt14", "--raw-dir", raw, "--work-dir", work, "--cpu"], check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "test.orig.en" in proc.stderr and "Traceback" not in proc.stderr
    assert not (work / "data-bin").exists()
