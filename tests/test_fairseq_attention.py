"""The attention of the fairseq layer, checked on models as fairseq builds and loads them:
no path around the normalizer in the state fairseq-generate uses, incremental decoding and
beam search equal to the full forward, softmax equal to fairseq's own transformer, learned
alpha, the choice of normalizer per attention type."""

import argparse
import math
import subprocess
import sys

import pytest
import torch
from fairseq import checkpoint_utils, options, tasks

from blocked_calls import normalizers_see_blocked_calls
from conftest import TINY_MODEL_ARGS
from fairseq_entmax.models import sparse_attention_modules
from fairseq_entmax.modules import SparseMultiheadAttention
from fairseq_entmax.normalizers import NORMALIZER_NAMES, build_normalizer
from helpers import USER_DIR

# Every test here trains through fairseq-train or runs a fairseq command.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fairseq_plugin")]

# The session models' sizes and dropout 0 (conftest), without their architecture: each test
# names its own.
_ARCH = TINY_MODEL_ARGS.index("--arch")
TINY_SIZES = TINY_MODEL_ARGS[:_ARCH] + TINY_MODEL_ARGS[_ARCH + 2 :]


def parse_training_args(data_bin, arguments):
    """fairseq-train's arguments, parsed as fairseq-train parses them (--user-dir, --cpu).

    Args:
        data_bin: the data-bin.
        arguments: the other command-line arguments.

    Returns:
        An argparse.Namespace.
    """
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, [str(data_bin), "--user-dir", USER_DIR, "--cpu", *arguments])


def build_model(data_bin, arguments, seed=0):
    """A model as fairseq-train builds it from these command-line arguments.

    Args:
        data_bin: the data-bin (its dictionaries size the model).
        arguments: fairseq-train's other arguments (--arch and its options).
        seed: torch's seed for the initialisation.

    Returns:
        (model, task).
    """
    args = parse_training_args(data_bin, arguments)
    task = tasks.setup_task(args)
    torch.manual_seed(seed)
    return task.build_model(args), task


def load_for_generation(model_info):
    """The model as fairseq-generate loads it: from the checkpoint, prepared for inference,
    eval mode.

    Args:
        model_info: what the `trained_model` fixture returns (checkpoint, data_bin).

    Returns:
        (model, task).
    """
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task(
        [str(model_info.checkpoint)], arg_overrides={"data": str(model_info.data_bin)}
    )
    model = models[0]
    model.prepare_for_inference_(cfg)
    model.eval()
    return model, task


def test_batch(task, split="test", max_sentences=8):
    """The first batch of a split, unshuffled.

    Args:
        task: the fairseq task (its data-bin).
        split: the split.
        max_sentences: the batch's most sentences.

    Returns:
        The batch, as fairseq's iterators give it (net_input, target, ...).
    """
    task.load_dataset(split)
    iterator = task.get_batch_iterator(dataset=task.dataset(split), max_sentences=max_sentences).next_epoch_itr(
        shuffle=False
    )
    return next(iterator)


test_batch.__test__ = False  # a helper, not a test


def record_normalizer_calls(model):
    """Hook every attention's normalizer module to keep its (scores, probabilities); the
    hooks stay on the model, which each test loads for itself. Calls through the blocked
    attention reach the hooks inside blocked_calls.normalizers_see_blocked_calls().

    Args:
        model: a model of this package.

    Returns:
        {(attention type, layer): [(scores, probabilities), ...]}, filled as the model runs.
    """
    calls = {}
    for attention_type, layer, attention in sparse_attention_modules(model):

        def record(module, inputs, probabilities, key=(attention_type, layer)):
            calls.setdefault(key, []).append((inputs[0].detach(), probabilities.detach()))

        attention.normalizer.register_forward_hook(record)
    return calls


@pytest.mark.parametrize("normalizer", ["sparsemax", "softmax"])
def test_generation_uses_the_normalizer_everywhere(trained_model, monkeypatch, normalizer):
    """In fairseq-generate's state (checkpoint, eval mode, beam search) every attention goes
    through the normalizer, never PyTorch's fused attention: sparsemax gives exact zeros on
    keys that are not masked; the softmax model (the control) gives none."""
    model, task = load_for_generation(trained_model(normalizer))

    def fused_attention(*args, **kwargs):
        raise AssertionError("F.multi_head_attention_forward bypassed the normalizer")

    monkeypatch.setattr(torch.nn.functional, "multi_head_attention_forward", fused_attention)
    calls = record_normalizer_calls(model)
    sample = test_batch(task)
    generator = task.build_generator([model], argparse.Namespace(beam=4))
    with normalizers_see_blocked_calls():  # the encoder's, which return no weights
        hypotheses = task.inference_step(generator, [model], sample)
    assert len(hypotheses) == len(sample["id"])

    expected = {(t, layer) for t in ("encoder_self", "decoder_self", "cross") for layer in (0, 1)}
    assert set(calls) == expected
    for key, key_calls in calls.items():
        zeros_on_unmasked_keys = 0
        for scores, probabilities in key_calls:
            rows = probabilities.sum(-1)
            has_keys = torch.isfinite(scores).any(-1)
            assert torch.allclose(rows[has_keys], torch.ones_like(rows[has_keys]), atol=1e-5)
            assert (probabilities[~torch.isfinite(scores)] == 0).all()
            zeros_on_unmasked_keys += int(((probabilities == 0) & torch.isfinite(scores)).sum())
        if normalizer == "sparsemax":
            assert zeros_on_unmasked_keys > 0, key
        else:
            assert zeros_on_unmasked_keys == 0, key


def test_returned_attention_weights_are_the_sparse_probabilities(trained_model):
    model, task = load_for_generation(trained_model("sparsemax"))
    sample = test_batch(task)
    net_input = sample["net_input"]
    batch, source_len = net_input["src_tokens"].shape
    source_padding = net_input["src_tokens"].eq(task.source_dictionary.pad())
    with torch.no_grad():
        # What fairseq-generate --print-alignment reads: the last layer's cross attention,
        # averaged over heads.
        _, extra = model(**net_input)
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        states = encoder_out["encoder_out"][0]
        _, head_weights = model.decoder.layers[-1].encoder_attn(
            torch.randn(3, batch, 32),
            states,
            states,
            key_padding_mask=encoder_out["encoder_padding_mask"][0],
            static_kv=True,
            need_head_weights=True,
        )
    averaged = extra["attn"][0]  # (batch, target, source)
    torch.testing.assert_close(averaged.sum(-1), torch.ones(averaged.shape[:2]), atol=1e-5, rtol=0)
    assert (averaged.masked_select(source_padding.unsqueeze(1)) == 0).all()
    assert ((averaged == 0) & ~source_padding.unsqueeze(1)).any()  # sparse beyond padding
    assert head_weights.shape == (4, batch, 3, source_len)  # per head, heads first
    torch.testing.assert_close(head_weights.sum(-1), torch.ones(4, batch, 3), atol=1e-5, rtol=0)
    assert ((head_weights == 0) & ~source_padding[None, :, None, :]).any()
    torch.testing.assert_close(head_weights.mean(0).sum(-1), torch.ones(batch, 3), atol=1e-5, rtol=0)


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_incremental_decoding_equals_the_full_forward(trained_model, normalizer):
    model, task = load_for_generation(trained_model(normalizer))
    sample = test_batch(task)
    net_input = sample["net_input"]
    prev_output_tokens = net_input["prev_output_tokens"]
    with torch.no_grad():
        full_logits, full_extra = model(**net_input)
        encoder_out = model.encoder(net_input["src_tokens"], net_input["src_lengths"])
        incremental_state = {}
        for step in range(prev_output_tokens.size(1)):
            step_logits, step_extra = model.decoder(
                prev_output_tokens[:, : step + 1],
                encoder_out=encoder_out,
                incremental_state=incremental_state,
            )
            # Padding positions at the end of shorter targets are garbage in both (as in
            # fairseq's transformer); every real position must agree.
            real = prev_output_tokens[:, step].ne(task.target_dictionary.pad())
            torch.testing.assert_close(step_logits[real, -1], full_logits[real, step], atol=1e-5, rtol=0)
            torch.testing.assert_close(
                step_extra["attn"][0][real, -1], full_extra["attn"][0][real, step], atol=1e-5, rtol=0
            )
        assert prev_output_tokens.size(1) > 3


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_beam_search_scores_equal_the_full_forward(trained_model, normalizer):
    """Beam search (incremental state reordered between hypotheses) scores each token of its
    best hypothesis as the full forward scores that hypothesis."""
    model, task = load_for_generation(trained_model(normalizer))
    sample = test_batch(task, max_sentences=4)
    generator = task.build_generator([model], argparse.Namespace(beam=4))
    with normalizers_see_blocked_calls():  # the encoder's, which return no weights
        hypotheses = task.inference_step(generator, [model], sample)
    eos = task.target_dictionary.eos()
    for i, sentence_hypotheses in enumerate(hypotheses):
        best = sentence_hypotheses[0]
        tokens = best["tokens"].unsqueeze(0)
        prev_output_tokens = torch.cat([torch.tensor([[eos]]), tokens[:, :-1]], dim=1)
        length = int(sample["net_input"]["src_lengths"][i])
        src_tokens = sample["net_input"]["src_tokens"][i : i + 1]
        src_tokens = src_tokens[:, src_tokens.size(1) - length :]  # left-padded source
        with torch.no_grad():
            logits, _ = model(src_tokens, torch.tensor([length]), prev_output_tokens)
            log_probs = model.get_normalized_probs((logits, None), log_probs=True)
        rescored = log_probs[0].gather(-1, tokens[0].unsqueeze(-1)).squeeze(-1)
        torch.testing.assert_close(rescored, best["positional_scores"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_beamable_cross_attention_equals_the_plain_one(normalizer):
    """fairseq's beamable encoder-decoder attention (keys stored once per sentence when a
    beam size is set, as BART's generation does) gives the same output and weights."""
    torch.manual_seed(0)
    attention = SparseMultiheadAttention(
        16,
        4,
        attention_type="cross",
        normalizer=build_normalizer(normalizer, 4, topk=2),
        encoder_decoder_attention=True,
    ).eval()
    beam, sentences, source_len = 3, 2, 5
    query = torch.randn(1, sentences * beam, 16)
    keys = torch.randn(source_len, sentences, 16)
    padding = torch.zeros(sentences, source_len, dtype=torch.bool)
    padding[1, :2] = True
    replicated_keys = keys.repeat_interleave(beam, dim=1)
    replicated_padding = padding.repeat_interleave(beam, dim=0)
    plain = attention(
        query,
        replicated_keys,
        replicated_keys,
        key_padding_mask=replicated_padding,
        static_kv=True,
        incremental_state={},
        need_head_weights=True,
    )
    attention.set_beam_size(beam)
    beamable = attention(
        query, keys, keys, key_padding_mask=padding, static_kv=True, incremental_state={}, need_head_weights=True
    )
    torch.testing.assert_close(beamable[0], plain[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(beamable[1], plain[1], atol=1e-5, rtol=0)


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
def test_a_boolean_attention_mask_hides_what_it_marks(normalizer):
    """PyTorch and fairseq's fused path read a boolean attn_mask as True = not allowed; the
    Python path this module keeps to adds the mask to the scores, which hid nothing."""
    from fairseq.modules import MultiheadAttention

    torch.manual_seed(0)
    attention = SparseMultiheadAttention(
        16, 4, attention_type="decoder_self", normalizer=build_normalizer(normalizer, 4, topk=2), self_attention=True
    ).eval()
    x = torch.randn(5, 2, 16)
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    additive = torch.zeros(5, 5).masked_fill(future, float("-inf"))
    out_bool, weights_bool = attention(x, x, x, attn_mask=future, need_head_weights=True)
    out_float, weights_float = attention(x, x, x, attn_mask=additive, need_head_weights=True)
    torch.testing.assert_close(out_bool, out_float, atol=0, rtol=0)
    assert (weights_bool[..., future] == 0).all()
    if normalizer == "softmax":  # and as fairseq's own attention reads the boolean mask
        plain = MultiheadAttention(16, 4, self_attention=True).eval()
        plain.load_state_dict(attention.state_dict())
        torch.testing.assert_close(out_bool, plain(x, x, x, attn_mask=future)[0], atol=1e-6, rtol=0)


def test_softmax_everywhere_equals_fairseqs_transformer(tiny_data):
    ours, task = build_model(
        tiny_data.data_bin,
        ["--arch", "adaptively_sparse_transformer", "--attention-normalizer", "softmax", "--dropout", "0", *TINY_SIZES],
    )
    reference, _ = build_model(tiny_data.data_bin, ["--arch", "transformer", "--dropout", "0", *TINY_SIZES])
    assert ours.state_dict().keys() == reference.state_dict().keys()
    ours.load_state_dict(reference.state_dict())
    sample = test_batch(task, split="valid")
    # fairseq's transformer computes this through PyTorch's fused attention, in training
    # and in eval mode: an independent reference for our normalizer path.
    for mode in ("train", "eval"):
        getattr(ours, mode)()
        getattr(reference, mode)()
        with torch.no_grad():
            our_logits, _ = ours(**sample["net_input"])
            reference_logits, _ = reference(**sample["net_input"])
        torch.testing.assert_close(our_logits, reference_logits, atol=1e-5, rtol=1e-5)


def test_every_parameter_takes_part_in_every_forward(tiny_data):
    model, task = build_model(tiny_data.data_bin, ["--arch", "adaptively_sparse_transformer", *TINY_SIZES])
    sample = test_batch(task, split="train")
    model.train()
    logits, _ = model(**sample["net_input"])
    log_probs = model.get_normalized_probs((logits, None), log_probs=True)
    loss = -log_probs.gather(-1, sample["target"].unsqueeze(-1)).sum()
    loss.backward()
    without_gradient = [name for name, p in model.named_parameters() if p.grad is None]
    assert without_gradient == []
    alpha_names = [name for name, _ in model.named_parameters() if name.endswith("alpha_logit")]
    assert len(alpha_names) == 6  # 2 encoder self + 2 decoder self + 2 cross
    assert "encoder.layers.0.self_attn.normalizer.alpha_logit" in alpha_names
    assert "decoder.layers.1.encoder_attn.normalizer.alpha_logit" in alpha_names
    for name, parameter in model.named_parameters():
        if name.endswith("alpha_logit"):
            assert parameter.shape == (4,)
            assert parameter.grad.abs().sum() > 0


def test_alpha_initialisation_and_clamp(tiny_data):
    random_model, _ = build_model(tiny_data.data_bin, ["--arch", "adaptively_sparse_transformer", *TINY_SIZES])
    logits = torch.cat([m.normalizer.alpha_logit.detach() for _, _, m in sparse_attention_modules(random_model)])
    assert logits.std() > 0.3  # N(0, 1): heads start at different alphas
    for _, _, attention in sparse_attention_modules(random_model):
        alpha = attention.normalizer.head_alpha()
        assert alpha.shape == (4,) and (alpha >= 1.01).all() and (alpha <= 2.0).all()
        with torch.no_grad():
            attention.normalizer.alpha_logit.fill_(-30.0)
        assert torch.equal(attention.normalizer.head_alpha(), torch.full((4,), 1.01))

    for alpha_init in ("1.5", "2"):
        model, _ = build_model(
            tiny_data.data_bin,
            [
                "--arch",
                "adaptively_sparse_transformer",
                "--alpha-init",
                alpha_init,
                "--alpha-clamp",
                "1.2,2",
                *TINY_SIZES,
            ],
        )
        for _, _, attention in sparse_attention_modules(model):
            torch.testing.assert_close(
                attention.normalizer.head_alpha(), torch.full((4,), float(alpha_init)), atol=1e-5, rtol=0
            )
            with torch.no_grad():
                attention.normalizer.alpha_logit.fill_(-30.0)
            assert torch.equal(attention.normalizer.head_alpha(), torch.full((4,), 1.2))


def test_every_attention_is_listed_in_training_with_layerdrop(tiny_data):
    """With --encoder/decoder-layerdrop, iterating the layers in training mode skips some at
    random: the alpha log then covered a random subset of layers, under shifted indices."""
    model, _ = build_model(
        tiny_data.data_bin,
        [
            "--arch",
            "adaptively_sparse_transformer",
            "--encoder-layerdrop",
            "0.5",
            "--decoder-layerdrop",
            "0.5",
            *TINY_SIZES,
        ],
    )
    model.train()
    expected = [(t, layer) for t in ("encoder_self",) for layer in range(2)] + [
        (t, layer) for layer in range(2) for t in ("decoder_self", "cross")
    ]
    for _ in range(10):
        listed = [(t, layer, m) for t, layer, m in sparse_attention_modules(model)]
        assert [(t, layer) for t, layer, _ in listed] == expected
        for _, layer, module in listed:
            owner = model.encoder if module.attention_type == "encoder_self" else model.decoder
            assert any(module is m for m in owner.layers[layer].modules())


def test_each_attention_type_gets_its_own_normalizer(tiny_data):
    model, _ = build_model(
        tiny_data.data_bin,
        [
            "--arch",
            "adaptively_sparse_transformer",
            "--attention-normalizer",
            "entmax15",
            "--encoder-self-attention-normalizer",
            "sparsemax",
            "--cross-attention-normalizer",
            "topk",
            "--topk",
            "2",
            *TINY_SIZES,
        ],
    )
    chosen = {(t, layer): m.normalizer.name for t, layer, m in sparse_attention_modules(model)}
    assert chosen == {
        ("encoder_self", 0): "sparsemax",
        ("encoder_self", 1): "sparsemax",
        ("decoder_self", 0): "entmax15",
        ("decoder_self", 1): "entmax15",
        ("cross", 0): "topk",
        ("cross", 1): "topk",
    }
    alphas = {t: m.normalizer.head_alpha() for t, _, m in sparse_attention_modules(model)}
    assert torch.equal(alphas["encoder_self"], torch.full((4,), 2.0))
    assert torch.equal(alphas["decoder_self"], torch.full((4,), 1.5))
    assert alphas["cross"] is None
    # No learned alpha, hence no alpha parameter: the state dict is the transformer's.
    assert not any(name.endswith("alpha_logit") for name, _ in model.named_parameters())


@pytest.mark.parametrize(
    "arch, normalizer, sizes",
    [
        ("adaptively_sparse_transformer", "alpha_entmax", "transformer"),
        ("adaptively_sparse_transformer_iwslt_de_en", "alpha_entmax", "transformer_iwslt_de_en"),
        ("adaptively_sparse_transformer_wmt_en_de", "alpha_entmax", "transformer_wmt_en_de"),
        ("adaptively_sparse_transformer_vaswani_wmt_en_de_big", "alpha_entmax", "transformer_vaswani_wmt_en_de_big"),
        ("explicit_sparse_transformer", "topk", "transformer"),
        ("explicit_sparse_transformer_iwslt_de_en", "topk", "transformer_iwslt_de_en"),
        ("explicit_sparse_transformer_wmt_en_de", "topk", "transformer_wmt_en_de"),
        ("explicit_sparse_transformer_vaswani_wmt_en_de_big", "topk", "transformer_vaswani_wmt_en_de_big"),
    ],
)
def test_architectures_have_fairseqs_sizes_and_their_default_attention(tiny_data, arch, normalizer, sizes):
    ours = vars(parse_training_args(tiny_data.data_bin, ["--arch", arch]))
    reference = vars(parse_training_args(tiny_data.data_bin, ["--arch", sizes]))
    for key in (
        "encoder_embed_dim",
        "encoder_ffn_embed_dim",
        "encoder_layers",
        "encoder_attention_heads",
        "decoder_embed_dim",
        "decoder_ffn_embed_dim",
        "decoder_layers",
        "decoder_attention_heads",
        "dropout",
        "attention_dropout",
        "encoder_normalize_before",
        "share_decoder_input_output_embed",
    ):
        assert ours[key] == reference[key], key
    assert ours["attention_normalizer"] == normalizer
    assert ours["topk"] == 8 and ours["alpha_init"] == "random" and tuple(ours["alpha_clamp"]) == (1.01, 2.0)


def topk_fraction_attention(attention_type, fraction, minimum):
    """Self-attention (width 16, 2 heads) with top-k keeping a share of the keys, eval mode.

    Args:
        attention_type: "encoder_self" or "decoder_self".
        fraction: --topk-fraction.
        minimum: --topk-min.

    Returns:
        The SparseMultiheadAttention.
    """
    torch.manual_seed(0)
    return SparseMultiheadAttention(
        16,
        2,
        attention_type=attention_type,
        normalizer=build_normalizer("topk", 2, topk_fraction=fraction, topk_min=minimum),
        self_attention=True,
    ).eval()


def test_topk_fraction_keeps_a_share_of_the_keys():
    attention = topk_fraction_attention("encoder_self", 0.25, 2)
    for length, kept in ((4, 2), (12, 3), (20, 5)):  # max(2, ceil(0.25 * length))
        x = torch.randn(length, 3, 16)
        _, weights = attention(x, x, x, need_head_weights=True)
        assert ((weights > 0).sum(-1) == kept).all(), length


def test_topk_fraction_decodes_incrementally_as_in_training():
    """k counts the keys each query sees: in training the causal mask hides the future, in
    incremental decoding the future is not there yet; both give the same k."""
    attention = topk_fraction_attention("decoder_self", 0.3, 1)
    length = 12
    x = torch.randn(length, 3, 16)
    future = torch.triu(torch.full((length, length), float("-inf")), 1)
    full, full_weights = attention(x, x, x, attn_mask=future, need_head_weights=True)
    incremental_state = {}
    for t in range(length):
        step, step_weights = attention(
            x[t : t + 1], x[t : t + 1], x[t : t + 1], incremental_state=incremental_state, need_head_weights=True
        )
        torch.testing.assert_close(step[0], full[t], atol=1e-5, rtol=0)
        kept = (step_weights > 0).sum(-1)
        assert (kept == max(1, math.ceil(0.3 * (t + 1)))).all(), t
        torch.testing.assert_close(step_weights[..., 0, :], full_weights[..., t, : t + 1], atol=1e-6, rtol=0)


def test_topk_fraction_does_not_depend_on_the_batchs_padding():
    """A sentence gets the same attention alone and left-padded in a batch with a longer one."""
    attention = topk_fraction_attention("encoder_self", 0.3, 1)
    sentence = torch.randn(7, 1, 16)
    alone, _ = attention(sentence, sentence, sentence)
    # 11 keys in the batch: counting padding, k would be ceil(0.3 * 11) = 4, not 3.
    padded = torch.cat([torch.randn(4, 1, 16), sentence])
    padding = torch.tensor([[True] * 4 + [False] * 7])
    batched, _ = attention(padded, padded, padded, key_padding_mask=padding)
    torch.testing.assert_close(batched[4:], alone, atol=1e-5, rtol=0)


def test_without_fairseq_only_the_normalizers_import():
    code = (
        "import sys\n"
        "sys.modules['fairseq'] = None  # as if fairseq were not installed\n"
        "import fairseq_entmax.normalizers, torch\n"
        "print(fairseq_entmax.normalizers.sparsemax(torch.tensor([1.0, 0.0, -3.0])).tolist())\n"
        "for name in ('fairseq_entmax.models', 'fairseq_entmax.modules'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ImportError as error:\n"
        "        print('ImportError', name, error)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "[1.0, 0.0, 0.0]"
    assert len(lines) == 3
    for line in lines[1:]:
        assert line.startswith("ImportError fairseq_entmax.mod")
        assert "fairseq-fixed==0.12.3.1" in line and "make setup" in line


def test_activation_checkpointing_wraps_the_sparse_layers(tiny_data):
    """--checkpoint-activations: fairseq's wrapping of each layer is kept, and the wrapped
    layers still use (and train) the sparse attention."""
    model, task = build_model(
        tiny_data.data_bin, ["--arch", "adaptively_sparse_transformer", "--checkpoint-activations", *TINY_SIZES]
    )
    assert all(hasattr(layer, "precheckpoint_forward") for layer in model.encoder.layers)
    assert len(list(sparse_attention_modules(model))) == 6
    sample = test_batch(task, split="train")
    model.train()
    logits, _ = model(**sample["net_input"])
    logits.logsumexp(-1).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    for _, _, attention in sparse_attention_modules(model):
        assert attention.normalizer.alpha_logit.grad.abs().sum() > 0
