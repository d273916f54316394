"""The paper recipes (examples/translation/recipe.py): the iwslt17 smoke mode end to end on the
real TED text in ../shared/data, skipping finished stages on a rerun; bad input stopped before
any long work; checkpoint averaging against an independent computation."""
import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import run

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "examples" / "translation" / "recipe.py"
SHARED_DATA = REPO.parent / "shared" / "data"
VARIANTS = ("softmax", "entmax15", "alpha_entmax", "topk")

sys.path.insert(0, str(REPO / "examples"))
from entmax_recipes import pipeline  # noqa: E402

needs_shared_data = pytest.mark.skipif(
    not (SHARED_DATA / "iwslt16_de_en_sample" / "train.de").exists(),
    reason=f"the smoke mode reads real text from {SHARED_DATA}, which is absent here",
)


@pytest.fixture(scope="module")
def iwslt_smoke(tmp_path_factory):
    work = tmp_path_factory.mktemp("iwslt17_smoke") / "work"
    proc = run([sys.executable, RECIPE, "iwslt17", "--smoke", "--work-dir", work], timeout=1200)
    return work, proc.stdout + proc.stderr


@needs_shared_data
def test_iwslt17_smoke_runs_every_stage(iwslt_smoke):
    work, output = iwslt_smoke
    rows = {row["model"]: row for row in json.loads((work / "results-seed1.json").read_text())}
    assert set(rows) == set(VARIANTS)
    # The smoke test set is the first 200 lines of TED tst2014.
    references = (SHARED_DATA / "iwslt16_de_en_sample" / "test.en").read_text(encoding="utf-8").split("\n")[:200]
    assert pipeline.read_lines(work / "raw" / "test.en") == [r.strip() for r in references]
    for variant, row in rows.items():
        # Averaged checkpoint of the last epochs, translated in full, scored three ways.
        assert Path(row["checkpoint"]).name == "checkpoint_avg3.pt" and Path(row["checkpoint"]).exists()
        hypotheses = pipeline.read_lines(work / "eval" / f"{variant}-seed1" / "test.hyp")
        assert len(hypotheses) == 200
        assert "tok:none" in row["bleu_tok_signature"] and "tok:13a" in row["bleu_signature"]
        assert 0 <= row["bleu_tok"] <= 100 and 0 <= row["bleu"] <= 100 and 0 <= row["chrf"] <= 100
        assert row["train_seconds"] > 0
        assert set(row["density"]) == {"encoder_self", "decoder_self", "cross"}
    # Joint BPE: one codes file, one joined dictionary for both languages.
    assert (work / "bpe" / "codes").exists()
    assert (work / "data-bin" / "dict.de.txt").read_text() == (work / "data-bin" / "dict.en.txt").read_text()
    assert "tok BLEU" in output and "| alpha_entmax " in output


@needs_shared_data
def test_iwslt17_smoke_rerun_skips_finished_stages(iwslt_smoke):
    work, _ = iwslt_smoke
    stamp = (work / "data-bin" / "preprocess.done").stat().st_mtime
    proc = run([sys.executable, RECIPE, "iwslt17", "--smoke", "--work-dir", work], timeout=600)
    for variant in VARIANTS:
        assert f"{variant} [" in proc.stdout and "already trained" in proc.stdout
    assert "tokenize:" not in proc.stdout and "training (" not in proc.stdout
    assert (work / "data-bin" / "preprocess.done").stat().st_mtime == stamp


@needs_shared_data
def test_iwslt17_smoke_rerun_with_other_settings_is_refused(iwslt_smoke):
    """The models in the work dir were trained for 200 updates: a run asking for 7 stops
    with the reason instead of reporting them as 7-update models."""
    work, _ = iwslt_smoke
    proc = run([sys.executable, RECIPE, "iwslt17", "--smoke", "--work-dir", work, "--max-update", "7"],
               check=False, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "max_update: 200 then, 7 now" in proc.stderr and "another --work-dir" in proc.stderr
    assert "training (" not in proc.stdout and "Traceback" not in proc.stderr


@needs_shared_data
def test_iwslt17_smoke_rerun_with_other_data_is_refused(iwslt_smoke, tmp_path):
    """The work dir's corpus came from the shared data: a run pointed at other data stops
    instead of training on the old corpus."""
    work, _ = iwslt_smoke
    proc = run([sys.executable, RECIPE, "iwslt17", "--smoke", "--work-dir", work, "--shared-data", tmp_path],
               check=False, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"{tmp_path}" in proc.stderr and "another --work-dir" in proc.stderr and "Traceback" not in proc.stderr


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
        raw = _write_corpus(tmp_path / "raw", lines={(s, l): "" for s in ("train", "valid", "test") for l in ("de", "en")})
        expected = "empty"
    work = tmp_path / "work"
    proc = run([sys.executable, RECIPE, "iwslt17", "--raw-dir", raw, "--work-dir", work], check=False, timeout=120)
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert not (work / "tok").exists() and not (work / "data-bin").exists()


def test_recipe_rejects_unknown_language_pair_and_task(tmp_path):
    proc = run([sys.executable, RECIPE, "wmt16", "--src", "fr", "--tgt", "en", "--work-dir", tmp_path / "w"],
               check=False, timeout=60)
    assert proc.returncode == 2
    assert "unknown language pair fr-en" in proc.stderr and "--src ro --tgt en" in proc.stderr
    assert not (tmp_path / "w").exists()
    proc = run([sys.executable, RECIPE, "iwslt14"], check=False, timeout=60)
    assert proc.returncode == 2 and "invalid choice: 'iwslt14'" in proc.stderr


def test_recipe_reports_missing_smoke_data(tmp_path):
    proc = run([sys.executable, RECIPE, "kftt", "--smoke", "--shared-data", tmp_path / "nowhere",
                "--work-dir", tmp_path / "w"], check=False, timeout=60)
    assert proc.returncode == 2 and "smoke data" in proc.stderr and "nowhere" in proc.stderr


def test_average_checkpoints_is_the_mean_of_the_parameters(tmp_path):
    """Against the mean computed here; the last checkpoint's other fields are kept."""
    generator = torch.Generator().manual_seed(0)
    paths, params = [], []
    for i in range(3):
        model = {"w": torch.randn(4, 3, generator=generator), "b": torch.randn(3, generator=generator),
                 "steps": torch.tensor(i)}
        state = {"model": model, "optimizer_history": [{"num_updates": 10 * (i + 1)}], "cfg": {"i": i}}
        path = tmp_path / f"checkpoint{i + 1}.pt"
        torch.save(state, path)
        paths.append(path)
        params.append(model)
    out = tmp_path / "avg.pt"
    pipeline.average_checkpoints(paths, out)
    averaged = torch.load(out, weights_only=False)
    for key in ("w", "b"):
        torch.testing.assert_close(averaged["model"][key], torch.stack([p[key] for p in params]).mean(0))
    assert averaged["model"]["steps"].item() == 2 and averaged["cfg"] == {"i": 2}


def test_last_checkpoints_include_the_final_state_after_the_last_epoch_checkpoint(tmp_path):
    """fairseq stops at --max-update mid-epoch: that state is only in checkpoint_last.pt."""
    for name, updates in (("checkpoint1.pt", 77), ("checkpoint2.pt", 154), ("checkpoint3.pt", 231),
                          ("checkpoint_last.pt", 260)):
        torch.save({"model": {}, "optimizer_history": [{"num_updates": updates}]}, tmp_path / name)
    assert [p.name for p in pipeline.last_checkpoints(tmp_path, 3)] == ["checkpoint2.pt", "checkpoint3.pt",
                                                                         "checkpoint_last.pt"]
    torch.save({"model": {}, "optimizer_history": [{"num_updates": 231}]}, tmp_path / "checkpoint_last.pt")
    assert [p.name for p in pipeline.last_checkpoints(tmp_path, 3)] == ["checkpoint1.pt", "checkpoint2.pt",
                                                                         "checkpoint3.pt"]


def test_pipeline_names_the_attention_types_of_the_fairseq_layer():
    """The pipeline keeps a copy (importing the fairseq layer imports fairseq); its tables
    and log lines are keyed by these names."""
    from fairseq_entmax.modules import ATTENTION_TYPES

    assert pipeline.ATTENTION_TYPES == ATTENTION_TYPES


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
        pipeline.tokenize_file(raw, tmp_path / f"{name}.tok", lang)
        return pipeline.read_lines(tmp_path / f"{name}.tok")

    references_tok, hypotheses_tok = tokenized(references, "ref"), tokenized(hypotheses, "hyp")
    perfect = pipeline.score(references_tok, references_tok, references, lang)
    assert perfect["bleu"] == 100.0 and perfect["bleu_tok"] == 100.0
    one_wrong = pipeline.score(hypotheses_tok, references_tok, references, lang)
    assert 40.0 < one_wrong["bleu"] < 100.0
    assert f"tok:{pipeline.SACREBLEU_TOKENIZER[lang]}" in one_wrong["bleu_signature"]


def test_read_lines_keeps_alignment_with_unicode_separators(tmp_path):
    path = tmp_path / "text"
    path.write_text("eins\u2028zwei\nline two\r\n", encoding="utf-8")
    assert pipeline.read_lines(path) == ["eins\u2028zwei", "line two "]
    assert pipeline.count_lines(path) == 2


def _tar_gz(path, files):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_kftt_prepare_reads_the_official_archive_layout(tmp_path):
    """The offline path of the full recipe: an archive already in WORK/downloads is not
    downloaded again, and its data/orig files become line-aligned plain text."""
    sys.path.insert(0, str(REPO / "examples" / "translation"))
    import tasks

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    files = {}
    for split in ("train", "dev", "test"):
        # The tokenized copies, of the same names, come first in the archive: the recipe
        # must read data/orig wherever it is.
        files[f"kftt-data-1.0/data/tok/kyoto-{split}.ja"] = "トークン 化 さ れ た 囮 。\n"
        files[f"kftt-data-1.0/data/tok/kyoto-{split}.en"] = "a tokenized decoy .\n"
        files[f"kftt-data-1.0/data/orig/kyoto-{split}.ja"] = f"{split}の文。\n二行目\u2028です。\n"
        files[f"kftt-data-1.0/data/orig/kyoto-{split}.en"] = f"A {split} sentence.\nLine two.\n"
    _tar_gz(downloads / "kftt-data-1.0.tar.gz", files)
    url, name = tasks.TASKS["kftt"].downloads[0]
    assert tasks.download(url, downloads / name) == downloads / name  # present: no network needed
    out = tmp_path / "raw"
    tasks.TASKS["kftt"].prepare(downloads, out, "ja", "en")
    assert pipeline.read_lines(out / "valid.en") == ["A dev sentence.", "Line two."]
    assert pipeline.read_lines(out / "train.ja") == ["trainの文。", "二行目\u2028です。"]
    counts = pipeline.check_parallel_corpus({s: (out / f"{s}.ja", out / f"{s}.en") for s in ("train", "valid", "test")})
    assert counts == {"train": 2, "valid": 2, "test": 2}


def test_an_archive_with_two_files_of_the_asked_name_is_refused(tmp_path):
    """Reading whichever comes first could train on the wrong text: the recipe says so instead."""
    sys.path.insert(0, str(REPO / "examples" / "translation"))
    import tasks

    archive = tmp_path / "corpus.tgz"
    _tar_gz(archive, {"corpus/a/train.en": "one\n", "corpus/b/train.en": "two\n"})
    with pytest.raises(pipeline.PipelineError, match="several files ending in train.en"):
        tasks._member_lines(archive, "train.en")
    assert tasks._member_lines(archive, "b/train.en") == ["two"]


def test_iwslt17_prepare_drops_talk_metadata_lines(tmp_path):
    sys.path.insert(0, str(REPO / "examples" / "translation"))
    import tasks

    archive = tmp_path / "de-en.tgz"
    _tar_gz(archive, {
        "de-en/train.tags.de-en.de": "<url>http://x</url>\n<talkid>1</talkid>\nHallo Welt.\n<title>T</title>\nZwei.\n",
        "de-en/train.tags.de-en.en": "<url>http://x</url>\n<talkid>1</talkid>\nHello world.\n<title>T</title>\nTwo.\n",
    })
    assert tasks.iwslt_training_lines(archive, "de") == ["Hallo Welt.", "Zwei."]
    assert tasks.iwslt_training_lines(archive, "en") == ["Hello world.", "Two."]


def test_checkpoint_last_cut_short_by_an_interrupt_is_replaced_by_the_newest_complete_one(tmp_path):
    torch.save({"num_updates": 10}, tmp_path / "checkpoint1.pt")
    torch.save({"num_updates": 20}, tmp_path / "checkpoint2.pt")
    complete = (tmp_path / "checkpoint2.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(complete[: len(complete) // 2])

    pipeline._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert torch.load(tmp_path / "checkpoint_last.pt")["num_updates"] == 20


def test_checkpoint_last_cut_short_with_nothing_complete_is_removed(tmp_path):
    torch.save({"num_updates": 10}, tmp_path / "checkpoint_last.pt")
    complete = (tmp_path / "checkpoint_last.pt").read_bytes()
    (tmp_path / "checkpoint_last.pt").write_bytes(complete[:-30])

    pipeline._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_complete_checkpoint_last_is_left_alone(tmp_path):
    torch.save({"num_updates": 30}, tmp_path / "checkpoint_last.pt")
    torch.save({"num_updates": 20}, tmp_path / "checkpoint2.pt")
    before = (tmp_path / "checkpoint_last.pt").read_bytes()

    pipeline._repair_interrupted_checkpoint_last(tmp_path, "model")

    assert (tmp_path / "checkpoint_last.pt").read_bytes() == before


def _fake_tool_run(calls, write_output):
    """A stand-in for pipeline.run_logged that records each command and writes its output."""
    def run_logged(args, log_path, **kwargs):
        calls.append(args)
        write_output(args, len(calls))
    return run_logged


def test_translations_of_a_changed_checkpoint_are_made_again(tmp_path, monkeypatch):
    def write_output(args, count):
        results = Path(args[args.index("--results-path") + 1])
        (results / "generate-test.txt").write_text(f"H-0\t-0.1\ttranslation {count}\n")

    calls = []
    monkeypatch.setattr(pipeline, "run_logged", _fake_tool_run(calls, write_output))
    checkpoint = tmp_path / "checkpoint_last.pt"
    checkpoint.write_bytes(b"the first model")
    out = tmp_path / "eval"
    assert pipeline.generate("data-bin", checkpoint, "test", out) == ["translation 1"]
    assert pipeline.generate("data-bin", checkpoint, "test", out) == ["translation 1"]
    assert len(calls) == 1, "the finished translation was not reused"
    checkpoint.write_bytes(b"a model trained again")  # e.g. its folder deleted and retrained
    assert pipeline.generate("data-bin", checkpoint, "test", out) == ["translation 2"]
    assert pipeline.generate("data-bin", checkpoint, "test", out, beam=2) == ["translation 3"]


def test_analysis_is_reused_only_for_the_same_checkpoints(tmp_path, monkeypatch):
    """A second seed's models, though named as the first's, get their own analysis."""
    def write_output(args, count):
        out = Path(args[args.index("--output-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        paths = [a for i, a in enumerate(args) if args[i - 1] == "--path"]
        models = [{"name": "softmax", "path": str(p), "density": [{"attention": "cross", "fraction": count / 10}],
                   "alpha": []} for p in paths]
        (out / "analysis.json").write_text(json.dumps({"models": models}))

    calls = []
    monkeypatch.setattr(pipeline, "run_logged", _fake_tool_run(calls, write_output))
    seed1, seed2 = tmp_path / "softmax-seed1.pt", tmp_path / "softmax-seed2.pt"
    seed1.write_bytes(b"seed 1")
    seed2.write_bytes(b"seed 2")
    out = tmp_path / "analysis"
    first = pipeline.analyze("data-bin", {"softmax": seed1}, "test", out, tmp_path / "analysis.log")
    again = pipeline.analyze("data-bin", {"softmax": seed1}, "test", out, tmp_path / "analysis.log")
    assert first == again and len(calls) == 1
    other = pipeline.analyze("data-bin", {"softmax": seed2}, "test", out, tmp_path / "analysis.log")
    assert len(calls) == 2 and other["softmax"]["density"]["cross"] == pytest.approx(0.2)


def test_binarize_resumes_after_an_interrupted_fairseq_preprocess(tmp_path):
    """An interrupt can leave the dictionaries in the destination, which fairseq-preprocess
    then refuses to overwrite."""
    text = _write_corpus(tmp_path / "text")
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    (data_bin / "dict.de.txt").write_text("ein 1\n")
    pipeline.binarize(text, "de", "en", data_bin, tmp_path / "preprocess.log")
    assert (data_bin / "train.de-en.de.bin").exists()
    assert "Satz 2" in (data_bin / "dict.de.txt").read_text()


def test_a_failing_tool_is_reported_with_its_log_and_exit_status_1(tmp_path, capsys):
    log_path = tmp_path / "tool.log"
    failing_tool = [sys.executable, "-c", "import sys; print('out of memory'); sys.exit(3)"]
    status = pipeline.run_reporting_errors(lambda args: pipeline.run_logged(failing_tool, log_path), None)
    error = capsys.readouterr().err
    assert status == 1
    assert "failed (exit 3)" in error and "out of memory" in error and str(log_path) in error
