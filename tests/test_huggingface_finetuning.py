"""What fine-tuning a sparsified transformers model relies on: learned alphas that stay
float32 in a half-precision model, and a saved sparsified model that a plain from_pretrained
never turns into a softmax model. Tiny random models built from configs."""

import subprocess
import sys

import pytest
import torch

import fairseq_entmax.huggingface as sparse_hf
from huggingface_tiny import tiny_batch, tiny_model


def _alpha_logits(model):
    return [parameter for name, parameter in model.named_parameters() if name.endswith("alpha_logit")]


def _causal_lm_loss(model):
    inputs, _ = tiny_batch("llama")
    labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
    return model(**inputs, labels=labels).loss


@pytest.mark.parametrize("cast_after_sparsify", [False, True])
def test_bfloat16_alphas_are_float32_and_learn(cast_after_sparsify):
    """10 AdamW steps at lr 1e-4 move every alpha of a bfloat16 model: at alpha 1.8 (alpha_logit
    1.39), where bfloat16's spacing is 2**-7, each such update would round away. The alphas stay
    float32 whether the model was bfloat16 before sparsify or cast after it."""
    model = tiny_model("llama", "eager")
    if not cast_after_sparsify:
        model = model.to(torch.bfloat16)
    model = sparse_hf.sparsify(model, "alpha_entmax", alpha_init=1.8)
    if cast_after_sparsify:
        model = model.to(torch.bfloat16)
    model.train()
    logits = _alpha_logits(model)
    assert {parameter.dtype for parameter in logits} == {torch.float32}
    assert next(model.model.embed_tokens.parameters()).dtype == torch.bfloat16
    before = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(10):
        _causal_lm_loss(model).backward()
        optimizer.step()
        optimizer.zero_grad()
    after = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    assert all(new != old for new, old in zip(after, before))
    assert {parameter.dtype for parameter in logits} == {torch.float32}


def test_float16_model_trains_its_alphas_under_grad_scaler():
    """torch.amp.GradScaler refuses to unscale float16 gradients: the alphas of a float16
    model are float32, so 3 scaled steps train them and leave them finite."""
    model = sparse_hf.sparsify(tiny_model("llama", "eager").half(), "alpha_entmax", alpha_init=1.5).train()
    logits = _alpha_logits(model)
    before = torch.cat([parameter.detach().clone() for parameter in logits])
    optimizer = torch.optim.AdamW(logits, lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        scaler.scale(_causal_lm_loss(model).float()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    after = torch.cat([parameter.detach() for parameter in logits])
    assert after.dtype == torch.float32 and torch.isfinite(after).all()
    assert not torch.equal(after, before)


def test_a_plain_from_pretrained_refuses_a_sparsified_model(tmp_path):
    """A sparsified model's config.json names no implementation transformers knows: a plain
    from_pretrained (of the class or an Auto class) stops, saying how to load it, instead of
    giving a softmax model that drops the alphas. The package's loader gives the sparse model,
    and the saved model loads as softmax only when asked for explicitly."""
    from transformers import AutoModelForSeq2SeqLM, MarianMTModel

    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax")
    model.save_pretrained(tmp_path)
    for model_class in (MarianMTModel, AutoModelForSeq2SeqLM):
        with pytest.raises(
            ValueError,
            match=r"import fairseq_entmax.huggingface as sparse_hf and load it with sparse_hf.from_pretrained",
        ):
            model_class.from_pretrained(tmp_path)
    loaded = sparse_hf.from_pretrained(MarianMTModel, tmp_path)
    assert sparse_hf.alpha_table(loaded) == sparse_hf.alpha_table(model)
    dense = MarianMTModel.from_pretrained(tmp_path, attn_implementation="sdpa")
    assert dense.config._attn_implementation == "sdpa"


@pytest.mark.slow
def test_a_process_without_the_package_refuses_a_sparsified_model(tmp_path):
    """Where fairseq_entmax was never imported, loading stops with the same hint."""
    sparse_hf.sparsify(tiny_model("marian", "eager"), "entmax15").save_pretrained(tmp_path)
    code = (
        "import sys\n"
        "from transformers import AutoModelForSeq2SeqLM\n"
        "try:\n"
        f"    AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path)!r})\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "print('fairseq_entmax' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    printed = result.stdout.strip().splitlines()
    assert printed[-1] == "False"
    assert "import fairseq_entmax.huggingface as sparse_hf and load it with sparse_hf.from_pretrained" in printed[0]


def test_per_step_calls_do_not_walk_the_model():
    """set_num_updates and learned_alpha_statistics, which AlphaWarmupCallback calls at every
    optimizer step, read the normalizers sparsify attached instead of walking the modules."""
    model = sparse_hf.sparsify(tiny_model("marian", "eager"), "alpha_entmax", alpha_init=1.6, alpha_warmup_updates=4)

    def walk(*args, **kwargs):
        raise AssertionError("walked the model's modules")

    model.named_modules = model.modules = walk
    sparse_hf.set_num_updates(model, 2)
    statistics = sparse_hf.learned_alpha_statistics(model)
    assert set(statistics) == {"encoder_self", "decoder_self", "cross"}
    for values in statistics.values():  # halfway through the warm-up: 1 + 0.5 * 0.6
        assert values == pytest.approx({"mean": 1.3, "min": 1.3, "max": 1.3}, abs=1e-6)


def test_lora_trains_the_adapters_and_the_alphas_and_saves_both(tmp_path):
    """peft's LoRA on a sparsified model, the alphas in modules_to_save, stopped halfway
    through the alpha warm-up: training moves the adapters and the alphas, and the base model
    sparsified again (update count 0) with the saved adapter gives back the same alphas, warm-up
    position included, and the same logits."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import LlamaForCausalLM

    tiny_model("llama", "eager").save_pretrained(tmp_path / "base")

    def sparsified_base():
        base = LlamaForCausalLM.from_pretrained(tmp_path / "base")
        return sparse_hf.sparsify(base, "alpha_entmax", alpha_init=1.5, alpha_warmup_updates=6)

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=[sparse_hf.NORMALIZER_ATTRIBUTE])
    model = get_peft_model(sparsified_base(), lora).train()
    trained = sorted(name for name, parameter in model.named_parameters() if parameter.requires_grad)
    assert any("lora_B" in name for name in trained) and any(name.endswith("alpha_logit") for name in trained)
    before = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    lora_before = {name: p.detach().clone() for name, p in model.named_parameters() if "lora_B" in name}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        sparse_hf.set_num_updates(model, step)
        _causal_lm_loss(model).backward()
        optimizer.step()
        optimizer.zero_grad()
    sparse_hf.set_num_updates(model, 3)
    after = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    assert all(new != old for new, old in zip(after, before))
    assert all(1.05 < alpha < 1.45 for alpha in after)  # halfway from 1 to alphas near 1.5
    assert all(not torch.equal(p, lora_before[name]) for name, p in model.named_parameters() if "lora_B" in name)
    model.eval().save_pretrained(tmp_path / "adapter")

    loaded = PeftModel.from_pretrained(sparsified_base(), tmp_path / "adapter").eval()
    assert sparse_hf.alpha_table(loaded) == sparse_hf.alpha_table(model)
    assert sparse_hf.alpha_table(sparsified_base())[0]["alpha"] == 1.0  # what the base alone runs: softmax
    assert sparse_hf.alpha_table(sparsified_base())[0]["alpha"] == 1.0  # what the base alone runs: softmax
    inputs, _ = tiny_batch("llama")
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, atol=0, rtol=0)
