"""The analysis on checkpoints trained in the test through fairseq-train: attention capture
checked against attention recomputed from the module's projections, and the console script
fairseq-entmax-analyze end to end (analysis.json, tables, figures) comparing a plain fairseq
transformer (softmax), learned alpha-entmax and top-k."""

import csv
import inspect
import json
import re

import pytest
import torch

from fairseq_entmax.analysis import analyze
from fairseq_entmax.analysis.capture import attention_sites, capture_attention
from fairseq_entmax.analysis.cli import main
from fairseq_entmax.analysis.runner import load_checkpoint
from fairseq_entmax.analysis.training_log import read_log_file
from fairseq_entmax.names import ATTENTION_TYPES
from fairseq_entmax.normalizers import alpha_entmax
from helpers import USER_DIR, arguments, fairseq_command, run, run_analyze

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

LAYERS, HEADS = 2, 4  # of the tiny models (conftest.TINY_MODEL_ARGS)
TOPK = 3  # conftest trains top-k with --topk 3


@pytest.fixture(scope="module")
def plain_transformer(tiny_data, tiny_model_args, tmp_path_factory):
    """A plain fairseq `transformer` (not ours), trained without --user-dir."""
    save_dir = tmp_path_factory.mktemp("plain_transformer")
    arch = tiny_model_args.index("--arch")
    same_sizes = tiny_model_args[:arch] + ["--arch", "transformer"] + tiny_model_args[arch + 2 :]
    run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            *same_sizes,
            "--max-update",
            "30",
            "--save-dir",
            save_dir,
        ]
    )
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def alpha_with_logs(tiny_data, tiny_model_args, tmp_path_factory):
    """Learned alpha-entmax trained with --log-file and --tensorboard-logdir (per-head alphas)."""
    root = tmp_path_factory.mktemp("alpha_with_logs")
    run(
        [
            fairseq_command("fairseq-train"),
            tiny_data.data_bin,
            "--user-dir",
            USER_DIR,
            *tiny_model_args,
            "--attention-normalizer",
            "alpha_entmax",
            "--max-update",
            "30",
            "--save-dir",
            root / "checkpoints",
            "--log-file",
            root / "train.log",
            "--tensorboard-logdir",
            root / "tb",
        ]
    )
    return root


def checkpoint_alphas(checkpoint):
    """{(attention, layer): [alpha per head]} from the checkpoint's normalizer.alpha_logit parameters, by the
    contract: alpha = clamp(1 + sigmoid(alpha_logit), 1.01, 2)."""
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)["model"]
    names = {
        "encoder.layers.{}.self_attn": "encoder_self",
        "decoder.layers.{}.self_attn": "decoder_self",
        "decoder.layers.{}.encoder_attn": "cross",
    }
    return {
        (attention, layer): (1 + torch.sigmoid(state[pattern.format(layer) + ".normalizer.alpha_logit"]))
        .clamp(1.01, 2)
        .tolist()
        for pattern, attention in names.items()
        for layer in range(LAYERS)
    }


def a_batch(task, size=8):
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    return dataset.collater([dataset[i] for i in range(size)])


def recomputed_attention(module, inputs, normalize):
    """Attention weights (heads, batch, queries, keys) recomputed from the module's projections."""
    query, key = inputs["query"], inputs["key"]
    (tgt_len, bsz, dim), src_len = query.shape, key.size(0)
    heads, head_dim = module.num_heads, dim // module.num_heads
    q = (module.q_proj(query) * module.scaling).view(tgt_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    k = module.k_proj(key).view(src_len, bsz, heads, head_dim).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2)  # (batch, heads, queries, keys)
    if inputs.get("attn_mask") is not None:
        scores = scores + inputs["attn_mask"]
    if inputs.get("key_padding_mask") is not None:
        scores = scores.masked_fill(inputs["key_padding_mask"][:, None, None, :].bool(), float("-inf"))
    return normalize(scores.float()).transpose(0, 1)


def capture_with_inputs(model, sample):
    """Run the model under capture_attention; also record each attention module's inputs."""
    sites = attention_sites(model)
    captured, inputs, handles = {}, {}, []

    def record_inputs(site):
        def hook(module, args, kwargs):
            inputs[site.name] = inspect.signature(module.forward).bind(*args, **kwargs).arguments

        return hook

    for site in sites:
        handles.append(site.module.register_forward_pre_hook(record_inputs(site), with_kwargs=True))
    try:
        with torch.no_grad(), capture_attention(sites, lambda site, w: captured.__setitem__(site.name, w)):
            output = model(**sample["net_input"])
    finally:
        for handle in handles:
            handle.remove()
    return sites, captured, inputs, output


@pytest.mark.parametrize("which", ["plain_transformer", "alpha_entmax"])
def test_captured_weights_are_each_heads_real_attention(which, request, trained_model, tiny_data):
    if which == "plain_transformer":
        checkpoint = request.getfixturevalue("plain_transformer")
    else:
        checkpoint = trained_model("alpha_entmax").checkpoint
    model, _, task = load_checkpoint(checkpoint, tiny_data.data_bin, USER_DIR)
    model.eval()
    sample = a_batch(task)
    with torch.no_grad():
        plain_output, plain_extra = model(**sample["net_input"])
    sites, captured, inputs, (output, extra) = capture_with_inputs(model, sample)

    assert sorted({(s.attention, s.layer) for s in sites}) == sorted(
        (a, layer) for a in ATTENTION_TYPES for layer in range(LAYERS)
    )
    # capturing sends fairseq's fused self-attention down its Python path: same translation
    assert torch.allclose(output, plain_output, atol=1e-4)
    for site in sites:
        weights = captured[site.name]
        assert weights.shape[0] == HEADS and weights.dim() == 4, site.name
        if which == "plain_transformer":
            assert site.normalizer() == "softmax" and site.head_alpha() == [1.0] * HEADS
            normalize = lambda scores: torch.softmax(scores, dim=-1)  # noqa: E731
        else:
            alpha = torch.tensor(site.head_alpha()).view(1, HEADS, 1, 1)
            normalize = lambda scores, alpha=alpha: alpha_entmax(scores, alpha)  # noqa: E731
        expected = recomputed_attention(site.module, inputs[site.name], normalize)
        assert torch.allclose(weights, expected, atol=1e-5), site.name
        if which == "alpha_entmax" and site.attention != "decoder_self":
            # sparse: some allowed keys get exactly zero weight (decoder self-attention's first
            # queries have one or two keys, so only the other types are certain to show it)
            real_keys = ~sample["net_input"]["src_tokens"].eq(task.source_dictionary.pad())
            assert (weights[:, real_keys[:, None, :].expand_as(weights[0])] == 0).any(), site.name

    # fairseq's own head-averaged cross attention of the last layer matches the captured one
    last_cross = next(s for s in sites if s.attention == "cross" and s.layer == LAYERS - 1)
    assert torch.allclose(captured[last_cross.name].mean(0), plain_extra["attn"][0], atol=1e-5)


def rows(model_entry, key, attention=None):
    return [r for r in model_entry[key] if attention is None or r["attention"] == attention]


def test_console_script_compares_plain_transformer_alpha_entmax_and_topk(
    plain_transformer, trained_model, tiny_data, tmp_path
):
    alpha_model, topk_model = trained_model("alpha_entmax"), trained_model("topk")
    alpha_log = tmp_path / "alpha_train.log"
    alpha_log.write_text(alpha_model.train_log)
    output_dir = tmp_path / "analysis"
    proc = run_analyze(
        tiny_data.data_bin,
        output_dir,
        *arguments(
            f"""
            --path {plain_transformer} --name softmax --train-log auto
            --path {alpha_model.checkpoint} --name alpha --train-log {alpha_log}
            --path {topk_model.checkpoint} --name topk --train-log auto
            --subset valid --num-sentences 24 --max-tokens 100 --sentence-id 3
            """
        ),
    )
    # progress: fairseq-style log lines "analyzing alpha:   3 / 6 sentences=12"
    assert re.search(r"analyzing alpha:\s+\d+ / \d+ sentences=\d+", proc.stdout + proc.stderr)

    analysis = json.loads((output_dir / "analysis.json").read_text())
    softmax, alpha, topk = analysis["models"]
    assert [m["name"] for m in analysis["models"]] == ["softmax", "alpha", "topk"]
    for model in analysis["models"]:
        assert model["sentences"] == 24
        for key in ("path", "alpha", "density", "js", "positional_heads", "bpe_merging_heads", "interrogation_heads"):
            assert key in model, key
        assert len(model["alpha"]) == len(model["density"]) == 3 * LAYERS * HEADS
        assert {r["attention"] for r in model["density"]} == set(ATTENTION_TYPES)
        assert len(model["js"]) == 3 * LAYERS
        assert all(0.0 <= r["js"] <= 1.0 for r in model["js"])
        for r in model["density"]:
            assert 0.0 < r["fraction"] <= 1.0 and r["count"] >= 1.0

    # a plain fairseq transformer is analyzed as softmax: alpha 1, every allowed key attended
    assert set(softmax["normalizers"].values()) == {"softmax"}
    assert {r["alpha"] for r in softmax["alpha"]} == {1.0}
    assert all(r["fraction"] == pytest.approx(1.0) for r in softmax["density"])

    # learned alpha: the checkpoint's alphas, and sparser attention than softmax
    expected_alpha = checkpoint_alphas(alpha_model.checkpoint)
    for r in alpha["alpha"]:
        assert r["alpha"] == pytest.approx(expected_alpha[(r["attention"], r["layer"])][r["head"]], abs=1e-6)
    assert any(r["fraction"] < 0.99 for r in alpha["density"])
    # its alpha trajectories come from the given training log (json lines of fairseq-train)
    assert alpha["training_log"] == str(alpha_log)
    means = [t for t in alpha["alpha_trajectories"] if t["statistic"] == "mean"]
    assert {t["attention"] for t in means} == set(ATTENTION_TYPES)
    for t in alpha["alpha_trajectories"]:
        assert t["steps"] == sorted(t["steps"]) and len(t["steps"]) >= 2
        assert all(1.0 <= v <= 2.0 for v in t["values"])
    assert softmax["alpha_trajectories"] == [] and topk["alpha_trajectories"] == []
    # the same log's validation (fairseq-train validates at the end); the others logged nowhere
    assert alpha["validation_curve"]["num_updates"][-1] == 200 and alpha["validation_curve"]["ppl"][-1] > 1
    assert softmax["validation_curve"] is None and topk["validation_curve"] is None

    # top-k has no alpha, and no query attends to more than k keys
    assert {r["alpha"] for r in topk["alpha"]} == {None}
    for attention in ATTENTION_TYPES:
        heads = rows(topk, "density", attention)
        assert max(r["count"] for r in heads) <= TOPK + 1e-9, attention
    assert any(r["count"] < TOPK for r in rows(topk, "density", "decoder_self"))  # first queries see < k keys

    assert_positional_and_interrogation_heads(analysis)
    assert_tables(output_dir)
    assert_figures(output_dir)


def assert_positional_and_interrogation_heads(analysis):
    """Positional scores are averages of weights, and the listed heads those above the
    threshold; the toy corpus has no "?", so no head is an interrogation head."""
    for model in analysis["models"]:
        for r in model["positional"]:
            assert r["previous"] is None or 0.0 <= r["previous"] <= 1.0
        assert all(r["next"] is None for r in rows(model, "positional", "decoder_self"))
        listed = {(r["attention"], r["layer"], r["head"], r["direction"]) for r in model["positional_heads"]}
        above = {
            (r["attention"], r["layer"], r["head"], d)
            for r in model["positional"]
            for d in ("previous", "next")
            if r[d] is not None and r[d] >= analysis["positional_threshold"]
        }
        assert listed == above
        # interrogation scores for every head of every attention type; the toy corpus has no
        # "?" token, so none has a question mark to attend to and no head is listed
        assert len(model["interrogation"]) == 3 * LAYERS * HEADS
        assert all(r["mass"] is None for r in model["interrogation"]) and model["interrogation_heads"] == []
    assert analysis["interrogation_threshold"] == 0.5


def assert_tables(output_dir):
    """The comparison's CSV tables: one row per model and head / layer / type."""
    with open(output_dir / "comparison.csv") as f:
        comparison = list(csv.DictReader(f))
    assert [(r["model"], r["attention"]) for r in comparison] == [
        (m, a) for m in ("softmax", "alpha", "topk") for a in ATTENTION_TYPES
    ]
    assert {r["normalizer"] for r in comparison if r["model"] == "alpha"} == {"alpha_entmax"}
    assert all(r["interrogation_heads"] == "0" for r in comparison)
    with open(output_dir / "density_heads.csv") as f:
        assert len(list(csv.DictReader(f))) == 3 * 3 * LAYERS * HEADS
    for table in (
        "alpha.csv",
        "density_layers.csv",
        "density_types.csv",
        "js.csv",
        "positional.csv",
        "positional_heads.csv",
        "bpe_merging.csv",
        "bpe_merging_heads.csv",
        "interrogation.csv",
        "interrogation_heads.csv",
    ):
        assert (output_dir / table).read_text().startswith("model,attention,"), table


def assert_figures(output_dir):
    """The figures: comparison figures, per-model figures, one attention map per model, type and layer."""
    figures = {p.name for p in output_dir.glob("*.png")}
    # (learning_curves.png: the alpha model's training log has its validation)
    expected = {
        "alpha_histogram.png",
        "density_layers.png",
        "js_layers.png",
        "learning_curves.png",
        "alpha_heatmap_softmax.png",
        "alpha_heatmap_alpha.png",
        "alpha_trajectories_alpha.png",
    }
    expected |= {
        f"{kind}_{m}.png" for kind in ("density_heads", "specialisation") for m in ("softmax", "alpha", "topk")
    }
    expected |= {
        f"attention_map_{m}_{a}_L{layer}.png"
        for m in ("softmax", "alpha", "topk")
        for a in ATTENTION_TYPES
        for layer in range(LAYERS)
    }
    assert figures == expected
    for name in figures:
        assert (output_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_python_api_reads_per_head_alpha_from_the_recorded_tensorboard_log(alpha_with_logs, tiny_data, tmp_path):
    checkpoint = alpha_with_logs / "checkpoints" / "checkpoint_last.pt"
    analysis = analyze(
        [checkpoint], tiny_data.data_bin, tmp_path / "out", num_sentences=8, figures=False, progress=False
    )
    (model,) = analysis["models"]
    assert model["training_log"] == str(alpha_with_logs / "tb")  # found through the checkpoint's cfg
    per_head = {
        (t["attention"], t["layer"], t["head"]): t for t in model["alpha_trajectories"] if t["statistic"] == "head"
    }
    assert set(per_head) == {(a, layer, h) for a in ATTENTION_TYPES for layer in range(LAYERS) for h in range(HEADS)}
    # the last logged alpha of each head is (one optimizer step before) the checkpoint's alpha
    final = checkpoint_alphas(checkpoint)
    for (attention, layer, head), trajectory in per_head.items():
        assert trajectory["values"][-1] == pytest.approx(final[(attention, layer)][head], abs=0.02)
    # the --log-file of the same run gives the same mean alpha per update (to its 4 decimals)
    from_log = {(t["attention"], t["statistic"]): t for t in read_log_file(alpha_with_logs / "train.log")}
    for attention in ATTENTION_TYPES:
        tensorboard_mean = next(
            t for t in model["alpha_trajectories"] if t["attention"] == attention and t["statistic"] == "mean"
        )
        assert from_log[(attention, "mean")]["steps"] == tensorboard_mean["steps"]
        assert from_log[(attention, "mean")]["values"] == pytest.approx(tensorboard_mean["values"], abs=1e-4)
    assert not list((tmp_path / "out").glob("*.png"))
    assert (tmp_path / "out" / "analysis.json").exists()


def test_interrogation_scores_are_the_mass_on_the_question_mark_keys(trained_model, tiny_data, tmp_path, monkeypatch):
    """The toy corpus has no "?": one of its source words stands in for it. Encoder self- and
    cross attention (whose keys are source tokens) then score every head, decoder
    self-attention (target tokens) none; a threshold of 0 lists every scored head."""
    from fairseq_entmax.analysis import runner

    monkeypatch.setattr(runner, "QUESTION_MARK", "s3")
    checkpoint = trained_model("alpha_entmax").checkpoint
    analysis = analyze(
        [checkpoint],
        tiny_data.data_bin,
        tmp_path / "out",
        figures=False,
        progress=False,
        interrogation_threshold=0.0,
    )
    (model,) = analysis["models"]
    for attention in ATTENTION_TYPES:
        masses = [r["mass"] for r in rows(model, "interrogation", attention)]
        assert len(masses) == LAYERS * HEADS, attention
        if attention == "decoder_self":
            assert masses == [None] * len(masses)
        else:
            assert all(m is not None and 0.0 <= m <= 1.0 for m in masses), (attention, masses)
    scored = [(r["attention"], r["layer"], r["head"]) for r in model["interrogation"] if r["mass"] is not None]
    assert [(r["attention"], r["layer"], r["head"]) for r in model["interrogation_heads"]] == scored
    assert analysis["interrogation_threshold"] == 0.0


def test_bad_input_is_reported_with_what_to_do(tiny_data, tmp_path, capsys):
    # main() is the console script's entry point, called in-process to keep the test fast
    assert main([str(tiny_data.data_bin), "--path", str(tmp_path / "nope.pt"), "--output-dir", str(tmp_path)]) == 2
    assert "nope.pt does not exist" in capsys.readouterr().err
    assert (
        main(
            [
                str(tiny_data.data_bin),
                "--path",
                "a.pt",
                "--path",
                "b.pt",
                "--name",
                "only-one",
                "--output-dir",
                str(tmp_path),
            ]
        )
        == 2
    )
    assert "give one --name per --path" in capsys.readouterr().err
    assert main([str(tmp_path / "no-data-bin"), "--path", "a.pt", "--output-dir", str(tmp_path)]) == 2
    assert "data-bin directory" in capsys.readouterr().err


def test_every_input_is_checked_before_the_first_model_is_analyzed(trained_model, tiny_data, tmp_path, capsys):
    """A mistake in the last --path or --train-log, or in the data-bin, stops the command
    before any model is run (it used to come after the others' whole pass)."""
    good = str(trained_model("alpha_entmax").checkpoint)
    raw_text = tmp_path / "raw"
    raw_text.mkdir()
    (raw_text / "train.de").write_text("ein Satz .\n")
    cases = [
        (["--path", good, "--path", str(tmp_path / "nope.pt")], "nope.pt does not exist"),
        (["--path", good, "--train-log", str(tmp_path / "tensorbord")], "tensorbord does not exist"),
        (["--path", good, "--subset", "nosuch"], "has no subset 'nosuch'"),
        (["--path", good, "--name", "x y", "--path", good, "--name", "x_y"], "same figure file names"),
    ]
    for bad_arguments, message in cases:
        assert main([str(tiny_data.data_bin), *bad_arguments, "--output-dir", str(tmp_path / "out")]) == 2
        out, err = capsys.readouterr()
        assert message in err and "analyzing" not in out, bad_arguments
    assert main([str(raw_text), "--path", good, "--output-dir", str(tmp_path / "out")]) == 2
    assert "is not a fairseq data-bin" in capsys.readouterr().err
    assert not (tmp_path / "out" / "analysis.json").exists()


def test_unloadable_checkpoints_and_too_small_batches_say_what_to_do(trained_model, tiny_data, tmp_path, capsys):
    checkpoint = trained_model("alpha_entmax").checkpoint
    cut = tmp_path / "cut.pt"
    cut.write_bytes(checkpoint.read_bytes()[:5000])
    other_data = tmp_path / "other-data-bin"
    other_data.mkdir()
    for path in tiny_data.data_bin.iterdir():
        text = path.read_bytes()
        if path.name.startswith("dict."):  # another experiment's vocabulary: more words
            text += "".join(f"extra{i} 1\n" for i in range(8)).encode()
        (other_data / path.name).write_bytes(text)
    for data, path, message in [
        (tiny_data.data_bin, cut, "Is the checkpoint complete"),
        (other_data, checkpoint, "the data-bin its model was trained on"),
    ]:
        assert main([str(data), "--path", str(path), "--cpu", "--output-dir", str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert f"cannot load checkpoint {path}" in err and message in err and "Traceback" not in err
    assert (
        main(
            [
                str(tiny_data.data_bin),
                "--path",
                str(checkpoint),
                "--cpu",
                "--max-tokens",
                "5",
                "--output-dir",
                str(tmp_path / "out"),
            ]
        )
        == 2
    )
    assert re.search(r"a sentence of \d+ tokens does not fit .* give --max-tokens \d+ or more", capsys.readouterr().err)


def test_a_rerun_into_the_same_directory_leaves_no_figures_of_models_it_dropped(trained_model, tiny_data, tmp_path):
    alpha, topk = trained_model("alpha_entmax").checkpoint, trained_model("topk").checkpoint
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    analyze([alpha, topk], tiny_data.data_bin, out, names=["alpha", "topk"], num_sentences=8, progress=False)
    assert list(out.glob("*topk*.png")) and list(out.glob("*alpha*.png"))
    analyze([alpha], tiny_data.data_bin, out, names=["alpha"], num_sentences=8, progress=False)
    assert not list(out.glob("*topk*")) and list(out.glob("*alpha*.png"))
    assert (out / "notes.txt").read_text() == "mine"  # only what an analysis wrote is removed
