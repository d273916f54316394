"""The normalizers as transformers attention implementations, on tiny random models of each
family users run: Marian (encoder-decoder), BERT (encoder), Llama and Qwen2 (decoder-only with
grouped-query attention), T5 (relative position bias)."""

import pytest
import torch

import fairseq_entmax.huggingface as sparse_hf
from fairseq_entmax.attention import blocked as blocked_attention
from huggingface_tiny import DECODER_ONLY, ENCODER_DECODERS, FAMILIES, real_queries, seen_keys, tiny_batch, tiny_model

SPARSE = ("sparsemax", "entmax15", "alpha_entmax", "topk")
TOPK = 2


def _sparse_model(family, name, seed=0, **config_overrides):
    """A tiny model running `name`: sparsify for what has options or state, the registered name otherwise."""
    if name in ("alpha_entmax", "topk"):
        model = tiny_model(family, "eager", seed, **config_overrides)
        return sparse_hf.sparsify(model, name, alpha_init="random", topk=TOPK)
    return tiny_model(family, name, seed, **config_overrides)


def _padding_side(family):
    return "left" if family in DECODER_ONLY else "right"


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_plugin_softmax_equals_eager_attention(family, padding_side):
    """The functions around the normalizer (scores, grouped-query heads, masks, T5's bias,
    output layout) are those of transformers' eager attention: with the plugin's softmax, which
    trains through the blocked attention, the logits agree to 1e-6 in float32 and every gradient
    to 1e-5 of its largest entry (the blocks sum in another order), or to 1e-8 for those that are
    0 in exact arithmetic (a key bias's, under softmax)."""
    inputs, masks = tiny_batch(family, padding_side)
    real = real_queries(family, masks)
    results = []
    for implementation in ("eager", "softmax"):
        model = tiny_model(family, implementation)
        logits = model(**inputs).logits
        weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
        (logits * weights)[real].sum().backward()
        gradients = {name: parameter.grad for name, parameter in model.named_parameters() if parameter.grad is not None}
        results.append((logits[real].detach(), gradients))
    (eager_logits, eager_gradients), (plugin_logits, plugin_gradients) = results
    torch.testing.assert_close(plugin_logits, eager_logits, atol=1e-6, rtol=1e-6)
    assert plugin_gradients.keys() == eager_gradients.keys()
    for name, gradient in eager_gradients.items():
        scale = float(gradient.abs().max())
        torch.testing.assert_close(plugin_gradients[name], gradient, atol=max(1e-5 * scale, 1e-8), rtol=1e-5, msg=name)


# Large initial weights: peaked scores, so that the sparse maps leave out keys the query sees too.
_PEAKED = {
    "marian": {"init_std": 1.0},
    "bert": {"initializer_range": 1.0},
    "llama": {"initializer_range": 1.0},
    "qwen2": {"initializer_range": 1.0},
    "t5": {"initializer_factor": 20.0},
}


@pytest.mark.parametrize("name", SPARSE)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_sparse_weights_are_exact_zeros_on_unseen_keys(family, name):
    """output_attentions returns the sparse weights: exactly 0 on padded and future keys,
    rows summing to 1, some seen keys at exactly 0 too, and top-k keeping at most k keys."""
    model = _sparse_model(family, name, **_PEAKED[family])
    inputs, masks = tiny_batch(family, _padding_side(family))
    outputs = model(**inputs, output_attentions=True)
    zeros_among_seen = 0
    for output_name, seen in seen_keys(family, masks).items():
        for weights in getattr(outputs, output_name):
            seen_here = seen.expand_as(weights)
            assert torch.all(weights[~seen_here] == 0), output_name
            has_keys = seen_here.any(-1)
            sums = weights.sum(-1)
            torch.testing.assert_close(sums[has_keys], torch.ones_like(sums[has_keys]), atol=1e-5, rtol=0)
            assert torch.all(sums[~has_keys] == 0)  # a left-padded query sees no key at all
            zeros_among_seen += int((weights[seen_here] == 0).sum())
            if name == "topk":
                assert int((weights > 0).sum(-1).max()) <= TOPK
    assert zeros_among_seen > 0


@pytest.mark.parametrize("family", sorted(set(ENCODER_DECODERS) | set(DECODER_ONLY)))
def test_future_keys_are_masked_without_padding(family):
    """Without padding, transformers' sdpa mask would leave the causal mask to sdpa's is_causal;
    the mask function registered here builds it."""
    model = tiny_model(family, "entmax15")
    inputs, _ = tiny_batch(family)
    unpadded = {key: value[:1] for key, value in inputs.items() if not key.endswith("attention_mask")}
    outputs = model(**unpadded, output_attentions=True)
    decoder = outputs.decoder_attentions if family in ENCODER_DECODERS else outputs.attentions
    for weights in decoder:
        future = torch.ones(weights.shape[-2:], dtype=torch.bool).triu(1)
        assert torch.all(weights[..., future] == 0)


def test_topk_fraction_keeps_a_share_of_the_seen_keys():
    """topk_fraction F keeps max(topk_min, ceil(F n)) keys of the n a query sees."""
    model = sparse_hf.sparsify(tiny_model("llama", "eager"), "topk", topk_fraction=0.5, topk_min=2)
    inputs, masks = tiny_batch("llama", "left")
    outputs = model(**inputs, output_attentions=True)
    seen = seen_keys("llama", masks)["attentions"]
    expected = torch.ceil(seen.sum(-1) * 0.5).clamp(min=2).minimum(seen.sum(-1))
    for weights in outputs.attentions:
        assert torch.equal((weights > 0).sum(-1), expected.expand(-1, weights.shape[1], -1))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["entmax15", "alpha_entmax", "topk"])
@pytest.mark.parametrize("family", sorted(set(ENCODER_DECODERS) | {"llama"}))
def test_greedy_generation_with_the_cache_equals_generation_without(family, name):
    """Decoding one token at a time against the KV cache (and the cross-attention's cached keys)
    gives the tokens that recomputing the whole prefix gives."""
    model = _sparse_model(family, name, **_PEAKED[family])
    inputs, _ = tiny_batch(family, _padding_side(family))
    inputs = {key: inputs[key] for key in ("input_ids", "attention_mask")}
    generated = [
        model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False, num_beams=1, use_cache=cache)
        for cache in (True, False)
    ]
    torch.testing.assert_close(generated[0], generated[1], atol=0, rtol=0)


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_dropout_drops_weights_in_training_only(family):
    """In training mode each weight is dropped or scaled by 1 / (1 - p), as eager attention does;
    in eval mode none is."""
    dropout = {"bert": {"attention_probs_dropout_prob": 0.5}, "llama": {"attention_dropout": 0.5}}[family]
    model = tiny_model(family, "entmax15", **dropout)
    inputs, _ = tiny_batch(family, _padding_side(family))
    evaluated = model(**inputs, output_attentions=True).attentions[0]
    assert torch.equal(model(**inputs, output_attentions=True).attentions[0], evaluated)
    model.train()
    torch.manual_seed(0)
    trained = model(**inputs, output_attentions=True).attentions[0]  # the first layer's inputs do not depend on dropout
    kept = trained != 0
    assert (evaluated[~kept] != 0).any(), "dropout dropped nothing"
    torch.testing.assert_close(trained[kept], evaluated[kept] * 2, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["entmax15", "alpha_entmax"])
def test_half_precision_normalises_in_float32(name):
    """A bfloat16 model gets bfloat16 weights, finite, exactly 0 where masked, within bfloat16's
    precision of the float32 model's (the scores are normalised in float32)."""
    inputs, masks = tiny_batch("llama", "left")
    seen = seen_keys("llama", masks)["attentions"]
    weights = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = _sparse_model("llama", name).to(dtype)
        weights[dtype] = model(**inputs, output_attentions=True).attentions
    for full, half in zip(weights[torch.float32], weights[torch.bfloat16]):
        assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
        assert torch.all(half[~seen.expand_as(half)] == 0)
        torch.testing.assert_close(half.float(), full, atol=3e-2, rtol=0)


@pytest.mark.parametrize("name", ("softmax",) + SPARSE)
def test_every_normalizer_gets_the_padding_mask(name):
    """Each name is an attention implementation with its mask function: without one,
    transformers would give the model no mask at all, and padded keys would get weight."""
    inputs, masks = tiny_batch("bert", "right")
    attentions = _sparse_model("bert", name)(**inputs, output_attentions=True).attentions
    padded = (masks["encoder"] == 0)[:, None, None, :]  # (batch, 1, 1, keys)
    assert padded.any() and len(attentions) > 0
    for weights in attentions:  # (batch, heads, queries, keys)
        assert torch.all(weights.masked_select(padded) == 0)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))


@pytest.mark.parametrize("name", ("softmax",) + SPARSE)
@pytest.mark.parametrize("family", ["llama", "t5"])
def test_the_blocked_path_equals_the_weights_path(family, name, monkeypatch):
    """Without output_attentions the functions run the blocked attention, which never holds the
    scores (held to its blocks here however small the call); with it, the materialized one.
    Logits and gradients agree to 1e-5 of their scale."""
    monkeypatch.setattr(blocked_attention, "MATERIALIZED_PER_INPUT_ELEMENT", 0)
    blocked_calls = []
    blocked = sparse_hf.attention.scaled_dot_product_attention

    def counted(*args, **kwargs):
        blocked_calls.append(1)
        return blocked(*args, **kwargs)

    monkeypatch.setattr(sparse_hf.attention, "scaled_dot_product_attention", counted)
    inputs, masks = tiny_batch(family, _padding_side(family))
    real = real_queries(family, masks)
    results = []
    for output_attentions in (False, True):
        model = _sparse_model(family, name, **_PEAKED[family])
        calls_before = len(blocked_calls)
        logits = model(**inputs, output_attentions=output_attentions).logits
        assert (len(blocked_calls) > calls_before) != output_attentions
        weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
        (logits * weights)[real].sum().backward()
        results.append((logits[real].detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (blocked_logits, blocked_gradients), (weights_logits, weights_gradients) = results
    scale = float(weights_logits.abs().max())
    torch.testing.assert_close(blocked_logits, weights_logits, atol=1e-5 * scale, rtol=0)
    assert blocked_gradients.keys() == weights_gradients.keys()
    for parameter, gradient in weights_gradients.items():
        scale = float(gradient.abs().max())
        torch.testing.assert_close(
            blocked_gradients[parameter], gradient, atol=max(1e-5 * scale, 1e-8), rtol=0, msg=parameter
        )


@pytest.mark.parametrize("path", ["blocked", "weights"])
def test_a_causal_module_called_without_a_mask_is_causal(path):
    """As sdpa reads such a call (transformers' mask left out for is_causal, continuous batching):
    a causal module with several queries and no mask sees no future key; a call with no mask,
    no causal module and packed-sequence metadata is refused."""
    model = tiny_model("llama", "entmax15")
    attention = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(2)
    query = torch.randn(1, 4, 7, 8, generator=generator)
    key, value = torch.randn(1, 2, 7, 8, generator=generator), torch.randn(1, 2, 7, 8, generator=generator)
    causal_mask = torch.ones(7, 7, dtype=torch.bool).tril().view(1, 1, 7, 7)
    keywords = dict(output_attentions=path == "weights")
    without_mask, _ = sparse_hf.ATTENTION_FUNCTIONS["entmax15"](attention, query, key, value, None, **keywords)
    with_mask, _ = sparse_hf.ATTENTION_FUNCTIONS["entmax15"](attention, query, key, value, causal_mask, **keywords)
    torch.testing.assert_close(without_mask, with_mask, atol=1e-6, rtol=0)
    full, _ = sparse_hf.ATTENTION_FUNCTIONS["entmax15"](attention, query, key, value, None, is_causal=False, **keywords)
    assert not torch.allclose(full, with_mask)
    with pytest.raises(ValueError, match="packed sequences"):
        sparse_hf.ATTENTION_FUNCTIONS["entmax15"](
            attention, query, key, value, None, is_causal=False, cu_seq_lens_q=torch.tensor([0, 3, 7]), **keywords
        )


def _tiny_gpt2(attn_implementation):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=40, n_positions=64, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0.0)
    config.embd_pdrop = config.attn_pdrop = 0.0
    torch.manual_seed(0)
    return GPT2LMHeadModel._from_config(config, attn_implementation=attn_implementation).eval()


def test_captured_weights_reach_the_user_where_the_model_drops_output_attentions():
    """GPT-2's forward pops output_attentions before its attention runs, so the keyword gives
    no weights; capture_attention_weights gives them, as eager attention computes them under
    softmax, and with exact zeros on future keys under entmax15."""
    ids = torch.randint(3, 40, (2, 7), generator=torch.Generator().manual_seed(0))
    eager = _tiny_gpt2("eager")(ids, output_attentions=True).attentions
    assert len(eager) == 2
    softmax = _tiny_gpt2("softmax")
    with sparse_hf.capture_attention_weights(softmax) as captured:
        softmax(ids)
    assert [(row["attention_type"], row["layer"]) for row in captured] == [("decoder_self", 0), ("decoder_self", 1)]
    for row, expected in zip(captured, eager):
        torch.testing.assert_close(row["weights"], expected, atol=1e-6, rtol=0)

    entmax = sparse_hf.sparsify(_tiny_gpt2("eager"), "entmax15")
    with sparse_hf.capture_attention_weights(entmax) as captured:
        entmax(ids)
    future = torch.ones(7, 7, dtype=torch.bool).triu(1)
    for row in captured:
        assert row["weights"].shape == (2, 2, 7, 7) and torch.all(row["weights"][..., future] == 0)
        torch.testing.assert_close(row["weights"].sum(-1), torch.ones(2, 2, 7), atol=1e-6, rtol=0)
    assert len(captured) == 2
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        with sparse_hf.capture_attention_weights(_tiny_gpt2("eager")):
            pass


def test_captured_weights_are_those_output_attentions_returns():
    """On a model that honours output_attentions (Marian), the capture holds the same tensors,
    one row per attention call, named by attention type and layer."""
    model = _sparse_model("marian", "alpha_entmax")
    inputs, _ = tiny_batch("marian")
    with sparse_hf.capture_attention_weights(model) as captured:
        outputs = model(**inputs, output_attentions=True)
    by_site = {(row["attention_type"], row["layer"]): row["weights"] for row in captured}
    assert len(by_site) == len(captured) == 6
    for attention_type, output_name in [
        ("encoder_self", "encoder_attentions"),
        ("decoder_self", "decoder_attentions"),
        ("cross", "cross_attentions"),
    ]:
        for layer, weights in enumerate(getattr(outputs, output_name)):
            assert torch.equal(by_site[attention_type, layer], weights)
