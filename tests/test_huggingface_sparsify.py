"""sparsify, from_pretrained, the warm-up and its Trainer callback, the alpha table, and the
errors of fairseq_entmax.huggingface, on tiny random models built from configs."""

import json
import os
import subprocess
import sys

import pytest
import torch

import fairseq_entmax.huggingface as sparse_hf
from fairseq_entmax.names import alpha_metric_name
from huggingface_tiny import FAMILIES, real_queries, tiny_batch, tiny_model

# family -> the attention types of its attention modules, in the model's order, and their heads.
ATTENTION = {
    "marian": [("encoder_self", 2)] * 2 + [("decoder_self", 4), ("cross", 4)] * 2,
    "bert": [("encoder_self", 2)] * 2,
    "llama": [("decoder_self", 4)] * 2,
    "qwen2": [("decoder_self", 4)] * 2,
    "t5": [("encoder_self", 2)] * 2 + [("decoder_self", 2), ("cross", 2)] * 2,
}


def _logits(model, family):
    inputs, masks = tiny_batch(family)
    with torch.no_grad():
        return model(**inputs).logits[real_queries(family, masks)]


def _state(model):
    """What a refusal must leave as it was: the parameters, the config, the modules."""
    return (
        {name: tensor.clone() for name, tensor in model.state_dict().items()},
        model.config.to_dict(),
        [type(module).__name__ for module in model.modules()],
    )


def _assert_same_state(before, after):
    assert before[0].keys() == after[0].keys()
    for name, tensor in before[0].items():
        assert torch.equal(tensor, after[0][name]), name
    assert before[1:] == after[1:]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sparsify_gives_every_attention_its_own_alphas(family):
    model = sparse_hf.sparsify(tiny_model(family, "eager"), "alpha_entmax", alpha_init=1.3)
    modules = sparse_hf.attention_modules(model)
    assert [(attention_type, heads) for attention_type, _, _, _, heads in modules] == ATTENTION[family]
    assert model.config._attn_implementation == sparse_hf.SPARSIFIED
    assert model.config.sparse_attention["normalizer"] == "alpha_entmax"
    logits = {name for name, _ in model.named_parameters() if name.endswith("attention_normalizer.alpha_logit")}
    assert len(logits) == len(modules)
    rows = sparse_hf.alpha_table(model)
    assert len(rows) == sum(heads for _, heads in ATTENTION[family])
    assert {row["attention_type"] for row in rows} == {attention_type for attention_type, _ in ATTENTION[family]}
    torch.testing.assert_close([row["alpha"] for row in rows], [1.3] * len(rows), atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    ("family", "name", "options"),
    [
        ("marian", "alpha_entmax", {"alpha_init": "random", "alpha_clamp": (1.05, 1.9)}),
        ("t5", "alpha_entmax", {"alpha_init": 1.6, "alpha_warmup_updates": 10}),
        ("llama", "topk", {"topk_fraction": 0.5, "topk_min": 2}),
        ("bert", "entmax15", {}),
    ],
)
def test_save_and_load_round_trip_exactly(tmp_path, family, name, options):
    """save_pretrained then from_pretrained gives the same class, normalizers, alphas, warm-up
    position and logits."""
    model = sparse_hf.sparsify(tiny_model(family, "eager"), name, **options)
    with torch.no_grad():  # learned alphas of their own, not their initial ones
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("alpha_logit"):
                parameter.add_(torch.randn_like(parameter))
    sparse_hf.set_num_updates(model, 3)
    model.save_pretrained(tmp_path)
    loaded = sparse_hf.from_pretrained(type(model), tmp_path)
    assert type(loaded) is type(model)
    assert loaded.config.sparse_attention == model.config.sparse_attention
    assert loaded.config._attn_implementation == sparse_hf.SPARSIFIED
    assert sparse_hf.alpha_table(loaded) == sparse_hf.alpha_table(model)
    assert torch.equal(_logits(loaded, family), _logits(model, family))


def test_an_auto_class_loads_a_sparsified_model(tmp_path):
    from transformers import AutoModelForSeq2SeqLM, MarianMTModel

    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax")
    model.save_pretrained(tmp_path)
    loaded = sparse_hf.from_pretrained(AutoModelForSeq2SeqLM, tmp_path)
    assert type(loaded) is MarianMTModel
    assert torch.equal(_logits(loaded, "marian"), _logits(model, "marian"))


def test_warm_up_starts_at_the_pretrained_softmax_model(tmp_path):
    """A pretrained softmax model on disk, sparsified with a warm-up of N updates, computes
    exactly what it computed (alpha 1 is softmax) and reaches its learned alphas at update N."""
    from transformers import MarianMTModel

    tiny_model("marian", "eager").save_pretrained(tmp_path)
    pretrained = MarianMTModel.from_pretrained(tmp_path, attn_implementation="eager")
    softmax = MarianMTModel.from_pretrained(tmp_path, attn_implementation="softmax")
    model = sparse_hf.sparsify(
        MarianMTModel.from_pretrained(tmp_path), "alpha_entmax", alpha_init=1.8, alpha_warmup_updates=10
    )
    assert {row["alpha"] for row in sparse_hf.alpha_table(model)} == {1.0}
    assert torch.equal(_logits(model, "marian"), _logits(softmax, "marian"))
    torch.testing.assert_close(_logits(model, "marian"), _logits(pretrained, "marian"), atol=1e-6, rtol=1e-6)
    for updates, alpha in [(5, 1.4), (10, 1.8), (20, 1.8)]:
        sparse_hf.set_num_updates(model, updates)
        alphas = [row["alpha"] for row in sparse_hf.alpha_table(model)]
        torch.testing.assert_close(alphas, [alpha] * len(alphas), atol=1e-6, rtol=0)


def test_one_training_step_moves_every_alpha():
    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax", alpha_init=1.5).train()
    before = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    inputs, _ = tiny_batch("marian")
    labels = inputs["decoder_input_ids"].masked_fill(inputs["decoder_attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(**inputs, labels=labels).loss.backward()
    optimizer.step()
    after = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    assert all(new != old for new, old in zip(after, before))


@pytest.mark.slow
def test_trainer_callback_follows_the_steps_and_logs_the_alphas(tmp_path):
    """Through transformers' Trainer: the warm-up follows the optimizer steps and every log line
    has the alphas' mean, min and max, as the fairseq layer logs them."""
    from transformers import Trainer, TrainingArguments

    model = sparse_hf.sparsify(tiny_model("llama", "eager"), "alpha_entmax", alpha_init=1.8, alpha_warmup_updates=4)
    inputs, _ = tiny_batch("llama")
    examples = [{"input_ids": ids, "attention_mask": mask, "labels": ids} for ids, mask in zip(*inputs.values())]
    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=3,
        per_device_train_batch_size=2,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=arguments, train_dataset=examples, callbacks=[sparse_hf.AlphaWarmupCallback()])
    trainer.train()
    assert model.config.sparse_attention["num_updates"] == 3
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [1, 2, 3]
    names = [alpha_metric_name("decoder_self", statistic) for statistic in ("mean", "min", "max")]
    for entry in logged:
        # alpha 1 + (step / 4) * 0.8 at each step, moved a little by training
        assert entry[names[1]] <= entry[names[0]] <= entry[names[2]]
        assert entry[names[0]] == pytest.approx(1 + entry["step"] / 4 * 0.8, abs=0.02)


# ---------------------------------------------------------------------------------------
# Errors: a clear message, and nothing half applied.


@pytest.mark.parametrize(
    ("name", "options", "error", "message"),
    [
        ("entmax2", {}, ValueError, "unknown normalizer 'entmax2'; known normalizers: softmax, sparsemax, entmax15"),
        ("topk", {"topk": 0}, ValueError, "topk: allowed values are integers >= 1, got 0"),
        ("topk", {"topk": 2.5}, ValueError, "topk: allowed values are integers >= 1"),
        ("topk", {"topk_fraction": 0}, ValueError, r"topk_fraction: allowed values are numbers in \(0, 1\]"),
        ("alpha_entmax", {"alpha_init": 1.005}, ValueError, r"alpha_init: 1.005 is outside alpha_clamp \(1.01, 2.0\)"),
        ("alpha_entmax", {"alpha_init": 2.5}, ValueError, r"alpha_init: allowed values are 'random' or a number in"),
        ("alpha_entmax", {"alpha_clamp": (1.5, 1.2)}, ValueError, "alpha_clamp: expected MIN,MAX with 1 <= MIN < MAX"),
        ("alpha_entmax", {"alpha_warmup_updates": -1}, ValueError, "alpha_warmup_updates: allowed values are integers"),
        ("alpha_entmax", {"alpha_inti": 1.5}, TypeError, "unknown option alpha_inti; known options: alpha_init"),
        (
            {"encoder": "entmax15"},
            {},
            ValueError,
            "unknown attention type 'encoder'; known attention types: encoder_self, decoder_self, cross",
        ),
        ({"cross": "entmax2"}, {}, ValueError, "unknown normalizer 'entmax2'; known normalizers: softmax"),
    ],
)
def test_bad_sparsify_arguments_are_refused_and_change_nothing(name, options, error, message):
    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax", alpha_init=1.3)
    before = _state(model)
    with pytest.raises(error, match=message):
        sparse_hf.sparsify(model, name, **options)
    _assert_same_state(before, _state(model))
    assert model.config._attn_implementation == sparse_hf.SPARSIFIED


def test_a_model_whose_attention_bypasses_the_interface_is_refused():
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    config = GPTNeoConfig(
        vocab_size=40,
        hidden_size=16,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        intermediate_size=32,
        bos_token_id=1,
        eos_token_id=1,
    )
    model = GPTNeoForCausalLM(config)
    before = _state(model)
    with pytest.raises(TypeError, match="GPTNeoForCausalLM: its attention GPTNeoAttention, GPTNeoSelfAttention do not"):
        sparse_hf.sparsify(model, "entmax15")
    with pytest.raises(
        TypeError, match="supports models whose attention modules call transformers' AttentionInterface"
    ):
        sparse_hf.attention_modules(model)
    _assert_same_state(before, _state(model))


def test_alpha_entmax_needs_sparsify():
    """Its alphas live on the attention modules: the registered name alone has none."""
    model = tiny_model("llama", "alpha_entmax")
    inputs, _ = tiny_batch("llama")
    with pytest.raises(ValueError, match=r"give the model its alphas with fairseq_entmax.huggingface.sparsify\(model"):
        model(**inputs)


def test_sparsify_chooses_the_normalizer_per_attention_type(tmp_path):
    """A dict chooses per attention type, as the fairseq layer's --encoder-self-, --decoder-self-
    and --cross-attention-normalizer do; a type left out runs softmax, as a type given "softmax"
    does. Each module's normalizer is what runs (the encoder's weights have exact zeros on keys it
    sees), and the record round-trips through save and load."""
    from transformers import MarianMTModel

    choice = {"encoder_self": "entmax15", "decoder_self": "alpha_entmax"}
    model = sparse_hf.sparsify(tiny_model("marian", "eager", init_std=1.0), choice, alpha_init=1.3)
    explicit = sparse_hf.sparsify(
        tiny_model("marian", "eager", init_std=1.0), {**choice, "cross": "softmax"}, alpha_init=1.3
    )
    rows = sparse_hf.alpha_table(model)
    assert {(row["attention_type"], row["normalizer"]) for row in rows} == {
        ("encoder_self", "entmax15"),
        ("decoder_self", "alpha_entmax"),
    }
    assert model.config.sparse_attention["normalizer"] == choice
    inputs, masks = tiny_batch("marian")
    outputs = model(**inputs, output_attentions=True)
    seen = masks["encoder"][:, None, None, :] == 1
    assert all((weights[seen.expand_as(weights)] == 0).any() for weights in outputs.encoder_attentions)
    assert torch.equal(_logits(model, "marian"), _logits(explicit, "marian"))
    model.save_pretrained(tmp_path)
    loaded = sparse_hf.from_pretrained(MarianMTModel, tmp_path)
    assert loaded.config.sparse_attention == model.config.sparse_attention
    assert sparse_hf.alpha_table(loaded) == rows
    assert torch.equal(_logits(loaded, "marian"), _logits(model, "marian"))


def test_set_num_updates_refuses_a_negative_count():
    model = sparse_hf.sparsify(tiny_model("llama", "eager"), "alpha_entmax", alpha_warmup_updates=4)
    with pytest.raises(ValueError, match="num_updates: allowed values are integers >= 0, got -1"):
        sparse_hf.set_num_updates(model, -1)


def _write_config(path, edit):
    config_file = os.path.join(path, "config.json")
    with open(config_file) as file:
        config = json.load(file)
    edit(config)
    with open(config_file, "w") as file:
        json.dump(config, file)


def test_unreadable_directories_are_refused(tmp_path):
    from transformers import MarianMTModel

    with pytest.raises(OSError, match="not a directory written by save_pretrained"):
        sparse_hf.from_pretrained(MarianMTModel, tmp_path / "missing")
    with pytest.raises(OSError, match="cannot read its config.json"):
        sparse_hf.from_pretrained(MarianMTModel, tmp_path)
    (tmp_path / "config.json").write_text("{ not json")
    with pytest.raises(OSError, match="cannot read its config.json"):
        sparse_hf.from_pretrained(MarianMTModel, tmp_path)

    plain = tmp_path / "plain"
    tiny_model("marian", "eager").save_pretrained(plain)
    with pytest.raises(ValueError, match=r"has no 'sparse_attention'\); load it with MarianMTModel.from_pretrained"):
        sparse_hf.from_pretrained(MarianMTModel, plain)

    def record_alpha_entmax(config):
        config["sparse_attention"] = {"normalizer": "alpha_entmax", "alpha_init": 1.5}

    _write_config(plain, record_alpha_entmax)
    with pytest.raises(ValueError, match="its weights lack .*attention_normalizer.alpha_logit"):
        sparse_hf.from_pretrained(MarianMTModel, plain)

    def record_nonsense(config):
        config["sparse_attention"] = {"normalizer": "topk", "topk": 0}

    _write_config(plain, record_nonsense)
    with pytest.raises(ValueError, match="topk: allowed values are integers >= 1, got 0"):
        sparse_hf.from_pretrained(MarianMTModel, plain)


def test_from_pretrained_keeps_the_recorded_normalizer(tmp_path):
    from transformers import MarianMTModel

    sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="was sparsified with 'alpha_entmax'; attn_implementation='sdpa' would drop"):
        sparse_hf.from_pretrained(MarianMTModel, tmp_path, attn_implementation="sdpa")


@pytest.mark.slow
def test_the_integration_imports_torch_and_transformers_only():
    code = (
        "import sys\n"
        "import fairseq_entmax.huggingface\n"
        "print('fairseq' in sys.modules, 'transformers' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
