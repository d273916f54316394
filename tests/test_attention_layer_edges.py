"""SparseMultiheadAttention at the edges, property-tested over random batches for every
normalizer: sequence lengths 1 to 60 (key length 1 included), batch size 1 and more, left and
right padding of the keys (key_padding_mask), training mode (with attention dropout) and eval
mode, scores from flat (all equal: ties) to sharply peaked.

- No NaN or inf in outputs, weights or gradients; padded keys get weight exactly 0 and their
  inputs gradient exactly 0, even with a nonzero upstream gradient on their weights.
- Incremental decoding (decoder self-attention step by step under a causal mask, then
  cross attention over padded encoder states with static keys) with beams 1 to 5, its
  incremental state reordered between steps as beam search reorders it, equals the full
  forward over the hypotheses' final histories.
"""

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fairseq_entmax.attention import blocked as blocked_attention
from fairseq_entmax.modules import SparseMultiheadAttention
from fairseq_entmax.normalizers import NORMALIZER_NAMES, build_normalizer

pytestmark = pytest.mark.usefixtures("fairseq_plugin")

EMBED_DIM = 16
MAX_LEN = 60
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: these are hundreds of small calls, which several threads slow down
    (5-8x on a busy 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@st.composite
def normalizer_options(draw):
    """Keyword arguments of the normalizer's options: the starting alphas of alpha_entmax
    (random per head, or every head at 1.01, 1.5 or 2) and top-k's k (fixed, 1 to 4, or a
    fraction of the keys each query sees)."""
    return dict(
        alpha_init=draw(st.sampled_from(["random", 1.01, 1.5, 2.0])),
        **draw(
            st.one_of(
                st.builds(dict, topk=st.integers(1, 4)),
                st.builds(dict, topk_fraction=st.sampled_from([0.1, 0.5, 1.0]), topk_min=st.integers(1, 2)),
            )
        ),
    )


def padding_mask(lengths, max_len, side):
    """(batch, max_len) key_padding_mask, True on padding, the real tokens on the left or right."""
    positions = torch.arange(max_len).unsqueeze(0)
    lengths = torch.tensor(lengths).unsqueeze(1)
    return positions >= lengths if side == "right" else positions < max_len - lengths


@st.composite
def padded_batches(draw):
    key_len = draw(st.integers(1, MAX_LEN))
    batch = draw(st.integers(1, 3))
    self_attention = draw(st.booleans())
    return dict(
        seed=draw(st.integers(0, 2**16)),
        heads=draw(st.sampled_from([2, 4])),
        self_attention=self_attention,
        key_len=key_len,
        query_len=key_len if self_attention else draw(st.integers(1, MAX_LEN)),
        lengths=draw(st.lists(st.integers(1, key_len), min_size=batch, max_size=batch)),
        side=draw(st.sampled_from(["left", "right"])),
        training=draw(st.booleans()),
        scale=draw(st.sampled_from([0.0, 1.0, 30.0])),
        options=draw(normalizer_options()),
    )


def padded_case(
    self_attention, key_len, query_len, lengths, side="right", training=False, scale=1.0, seed=0, heads=2, options=None
):
    """A padded_batches value written out, for the @example cases."""
    return dict(
        seed=seed,
        heads=heads,
        self_attention=self_attention,
        key_len=key_len,
        query_len=query_len,
        lengths=lengths,
        side=side,
        training=training,
        scale=scale,
        options=options or {},
    )


def attention(normalizer, attention_type, heads, options, dropout, **kwargs):
    return SparseMultiheadAttention(
        EMBED_DIM,
        heads,
        attention_type=attention_type,
        normalizer=build_normalizer(normalizer, heads, **options),
        dropout=dropout,
        **kwargs,
    )


@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
@settings(max_examples=40, **SETTINGS)
@given(case=padded_batches())
@example(case=padded_case(self_attention=True, key_len=1, query_len=1, lengths=[1]))  # one token, batch 1
@example(case=padded_case(self_attention=False, key_len=1, query_len=60, lengths=[1, 1, 1], training=True))
@example(
    case=padded_case(
        self_attention=True, key_len=60, query_len=60, lengths=[1, 60], side="left", scale=30.0, options={"topk": 4}
    )
)
def test_padded_keys_get_zero_weight_and_zero_gradient(normalizer, case):
    torch.manual_seed(case["seed"])
    self_attention = case["self_attention"]
    layer = attention(
        normalizer,
        "encoder_self" if self_attention else "cross",
        case["heads"],
        case["options"],
        dropout=0.1,
        self_attention=self_attention,
        encoder_decoder_attention=not self_attention,
    ).train(case["training"])
    padding = padding_mask(case["lengths"], case["key_len"], case["side"])
    batch = padding.size(0)
    keys = (torch.randn(case["key_len"], batch, EMBED_DIM) * case["scale"]).requires_grad_()
    query = (
        keys if self_attention else (torch.randn(case["query_len"], batch, EMBED_DIM) * case["scale"]).requires_grad_()
    )
    out, weights = layer(query, keys, keys, key_padding_mask=padding, need_head_weights=True)

    assert weights.shape == (case["heads"], batch, case["query_len"], case["key_len"])
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    padded_keys = padding[None, :, None, :].expand_as(weights)
    assert (weights[padded_keys] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-5, rtol=0)

    # Upstream gradients on the output and on every weight, padded keys' weights included. In
    # self-attention the padded positions are queries too: their rows get no upstream
    # gradient, so that all the gradient reaching them would come through their keys/values.
    out_upstream = torch.randn_like(out)
    weight_upstream = torch.randn_like(weights)
    if self_attention:
        out_upstream[padding.t()] = 0
        weight_upstream[padding[None, :, :, None].expand_as(weights)] = 0
    ((out * out_upstream).sum() + (weights * weight_upstream).sum()).backward()
    assert torch.isfinite(keys.grad).all() and torch.isfinite(query.grad).all()
    assert (keys.grad[padding.t()] == 0).all()
    assert (keys.grad[~padding.t()] != 0).any() or case["scale"] == 0
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@st.composite
def beam_searches(draw):
    sentences = draw(st.integers(1, 3))
    source_len = draw(st.integers(1, MAX_LEN))
    return dict(
        seed=draw(st.integers(0, 2**16)),
        heads=draw(st.sampled_from([2, 4])),
        sentences=sentences,
        beam=draw(st.integers(1, 5)),
        steps=draw(st.integers(1, MAX_LEN)),
        source_lengths=draw(st.lists(st.integers(1, source_len), min_size=sentences, max_size=sentences)),
        source_len=source_len,
        side=draw(st.sampled_from(["left", "right"])),
        training=draw(st.booleans()),
        scale=draw(st.sampled_from([1.0, 4.0])),
        options=draw(normalizer_options()),
    )


@pytest.mark.slow
@pytest.mark.parametrize("normalizer", NORMALIZER_NAMES)
@settings(max_examples=25, **SETTINGS)
@given(case=beam_searches())
@example(
    case=dict(
        seed=0,
        heads=2,
        sentences=1,
        beam=1,
        steps=1,
        source_lengths=[1],
        source_len=1,
        side="left",
        training=False,
        scale=1.0,
        options={},
    )
)
@example(
    case=dict(
        seed=1,
        heads=4,
        sentences=2,
        beam=5,
        steps=12,
        source_lengths=[1, 7],
        source_len=7,
        side="left",
        training=True,
        scale=4.0,
        options={"topk_fraction": 0.5},
    )
)
def test_incremental_beam_decoding_equals_the_full_forward(normalizer, case):
    """A decoder layer's two attentions: self-attention over the steps so far, then cross
    attention over the padded encoder states. The full forward (causal mask, in the mode of
    the case: training mode without dropout, with autograd, or eval mode, where the attention
    dropout of 0.1 is off) of each hypothesis' final history gives, at every step, the
    output and weights incremental decoding gave at that step."""
    torch.manual_seed(case["seed"])
    heads, beam, steps = case["heads"], case["beam"], case["steps"]
    dropout = 0.0 if case["training"] else 0.1
    self_attn = attention(normalizer, "decoder_self", heads, case["options"], dropout, self_attention=True)
    cross = attention(normalizer, "cross", heads, case["options"], dropout, encoder_decoder_attention=True)
    hypotheses = case["sentences"] * beam
    source_len = case["source_len"]
    # Encoder states and padding as beam search holds them: each sentence's repeated per hypothesis.
    encoder_padding = padding_mask(case["source_lengths"], source_len, case["side"]).repeat_interleave(beam, 0)
    encoder_out = (torch.randn(source_len, case["sentences"], EMBED_DIM) * case["scale"]).repeat_interleave(beam, 1)
    inputs = torch.randn(steps, hypotheses, EMBED_DIM) * case["scale"]
    generator = torch.Generator().manual_seed(case["seed"])

    self_attn.eval()
    cross.eval()
    state = {}
    history = inputs[:0]
    outputs = torch.zeros(0, hypotheses, EMBED_DIM)
    self_weights = torch.zeros(heads, hypotheses, steps, steps)
    cross_weights = torch.zeros(heads, hypotheses, steps, source_len)
    with torch.no_grad():
        for step in range(steps):
            if step > 0:
                # Beam search keeps, for each hypothesis slot, any hypothesis of the same sentence.
                new_order = torch.arange(hypotheses) // beam * beam + torch.randint(
                    beam, (hypotheses,), generator=generator
                )
                self_attn.reorder_incremental_state(state, new_order)
                cross.reorder_incremental_state(state, new_order)
                history, outputs = history[:, new_order], outputs[:, new_order]
                self_weights, cross_weights = self_weights[:, new_order], cross_weights[:, new_order]
            x = inputs[step : step + 1]
            h, w_self = self_attn(x, x, x, incremental_state=state, need_head_weights=True)
            h = h + x
            out, w_cross = cross(
                h,
                encoder_out,
                encoder_out,
                key_padding_mask=encoder_padding,
                incremental_state=state,
                static_kv=True,
                need_head_weights=True,
            )
            history = torch.cat([history, x])
            outputs = torch.cat([outputs, out])
            self_weights[:, :, step, : step + 1] = w_self[:, :, 0]
            cross_weights[:, :, step] = w_cross[:, :, 0]

    self_attn.train(case["training"])
    cross.train(case["training"])
    with torch.set_grad_enabled(case["training"]):
        causal = torch.full((steps, steps), float("-inf")).triu(1)
        h, full_self_weights = self_attn(history, history, history, attn_mask=causal, need_head_weights=True)
        h = h + history
        full_out, full_cross_weights = cross(
            h, encoder_out, encoder_out, key_padding_mask=encoder_padding, static_kv=True, need_head_weights=True
        )
    assert torch.isfinite(outputs).all()
    # Float32 rounding: the two compute the scores in different orders, and a score's rounding
    # grows with its size, i.e. with the square of the scale (measured: at most 1.3e-6 at
    # scale 1 and 8.2e-5 at scale 4 over 60 cases per normalizer).
    tolerance = dict(atol=2e-5 * case["scale"] ** 2, rtol=1e-5)
    torch.testing.assert_close(outputs, full_out.detach(), **tolerance)
    torch.testing.assert_close(self_weights, full_self_weights.detach(), **tolerance)
    torch.testing.assert_close(cross_weights, full_cross_weights.detach(), **tolerance)
    assert (cross_weights[encoder_padding[None, :, None, :].expand_as(cross_weights)] == 0).all()


@pytest.mark.parametrize("kind", ["encoder_self", "decoder_self", "cross"])
@pytest.mark.parametrize("name", NORMALIZER_NAMES)
def test_calls_without_weights_equal_calls_with_them(name, kind, monkeypatch):
    """A call that needs no weights runs the blocked attention (fairseq_entmax.attention, held
    to its blocks here however small the call); its output and gradients (inputs, parameters,
    learned alphas) equal those of the call that returns the weights, to 1e-5 of their scale
    (the alphas' to 1e-4): padded keys, the decoder's future mask, cross attention over padded
    encoder states."""
    monkeypatch.setattr(blocked_attention, "MATERIALIZED_PER_INPUT_ELEMENT", 0)
    torch.manual_seed(0)
    heads, tgt_len, src_len, batch = 4, 23, 19, 3
    normalizer = build_normalizer(name, heads, alpha_init="random", topk=3)
    layer = SparseMultiheadAttention(
        EMBED_DIM,
        heads,
        attention_type=kind,
        normalizer=normalizer,
        self_attention=kind != "cross",
        encoder_decoder_attention=kind == "cross",
    ).train()
    layer.dropout_module.p = 0.0
    for parameter in layer.parameters():  # peaked scores, so that the sparse maps leave keys out
        parameter.data.mul_(4.0)
    query = torch.randn(tgt_len, batch, EMBED_DIM, requires_grad=True)
    keys = query if kind != "cross" else torch.randn(src_len, batch, EMBED_DIM, requires_grad=True)
    arguments = dict(key_padding_mask=padding_mask([keys.shape[0], 7, 12], keys.shape[0], "right"))
    if kind == "decoder_self":
        arguments["attn_mask"] = torch.triu(torch.full((tgt_len, tgt_len), float("-inf")), 1)
    inputs = [query] + ([keys] if kind == "cross" else []) + list(layer.parameters())
    results = []
    for need_weights in (False, True):
        output, weights = layer(query, keys, keys, need_weights=need_weights, **arguments)
        assert (weights is None) != need_weights
        upstream = torch.randn(output.shape, generator=torch.Generator().manual_seed(1))
        results.append((output.detach(), torch.autograd.grad(output, inputs, upstream)))
    (blocked, blocked_gradients), (materialized, materialized_gradients) = results
    torch.testing.assert_close(blocked, materialized, atol=1e-5 * float(materialized.abs().max()), rtol=0)
    largest = max(float(expected.abs().max()) for expected in materialized_gradients)
    names = (["query"] + (["keys"] if kind == "cross" else [])) + [name for name, _ in layer.named_parameters()]
    for what, actual, expected in zip(names, blocked_gradients, materialized_gradients):
        # Every map is invariant to a shift of a row's scores: the key bias's gradient is 0 but
        # for rounding, which is measured against the largest gradient of the layer.
        scale = largest if what == "k_proj.bias" else float(expected.abs().max())
        # The alphas' gradient sums a term of every row: here both float32 paths are 2-4e-5 of
        # its scale off the float64 computation, so they are compared to 1e-4.
        tolerance = 1e-4 if what == "normalizer.alpha_logit" else 1e-5
        torch.testing.assert_close(actual, expected, atol=tolerance * scale, rtol=0, msg=what)
