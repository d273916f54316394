"""torch.compile of a sparsified transformers model: the compiled model computes what the
eager one does, in one graph, and an alpha warm-up does not recompile it at every step.
Tiny random models built from configs."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

import fairseq_entmax.huggingface as sparse_hf
from fairseq_entmax.names import NORMALIZER_NAMES
from huggingface_tiny import tiny_batch, tiny_model

pytestmark = pytest.mark.slow


def _loss(model, family):
    inputs, _ = tiny_batch(family)
    logits = model(**inputs).logits
    # A loss that reads every position, so that every attention gets a gradient.
    return logits, logits.float().square().mean()


# One layer per stack: each attention type once (Marian's encoder, decoder and cross
# attention), at half the tracing time of the two-layer models.
ONE_LAYER = {"llama": {"num_hidden_layers": 1}, "marian": {"encoder_layers": 1, "decoder_layers": 1}}


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("name", NORMALIZER_NAMES)
@pytest.mark.parametrize("family", ["llama", "marian"])
def test_a_compiled_model_equals_the_eager_one(family, name, fresh_dynamo):
    """Forward and backward of the compiled model agree with eager to 1e-5, in one graph
    without breaks. aot_eager traces what inductor traces (dynamo, then the autograd graph);
    inductor's code generation, which takes about a minute a model on this CPU, runs in
    test_an_alpha_warmup_compiles_once."""
    torch.manual_seed(0)
    model = tiny_model(family, "eager", **ONE_LAYER[family])
    model = sparse_hf.sparsify(model, name, alpha_init=1.5, alpha_warmup_updates=10).train()
    sparse_hf.set_num_updates(model, 4)
    parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]

    logits, loss = _loss(model, family)
    eager_gradients = torch.autograd.grad(loss, parameters)
    compiled_logits, compiled_loss = _loss(torch.compile(model, backend="aot_eager"), family)
    compiled_gradients = torch.autograd.grad(compiled_loss, parameters)

    torch.testing.assert_close(compiled_logits, logits, rtol=1e-5, atol=1e-6)
    for compiled_gradient, gradient in zip(compiled_gradients, eager_gradients):
        torch.testing.assert_close(compiled_gradient, gradient, rtol=1e-5, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1
    assert sum(counters["graph_break"].values()) == 0


def test_an_alpha_warmup_compiles_once(fresh_dynamo):
    """Twenty AdamW steps of a compiled Llama (torch.compile's default backend, inductor)
    through an alpha warm-up, set_num_updates before each: the first step compiles, the others
    reuse its graph, although the warm-up position changes at every step. The compiled forward
    equals the eager one to 1e-5, and the alphas learn."""
    torch.manual_seed(0)
    model = tiny_model("llama", "eager", **ONE_LAYER["llama"])
    model = sparse_hf.sparsify(model, "alpha_entmax", alpha_init=1.5, alpha_warmup_updates=10).train()
    compiled = torch.compile(model)
    sparse_hf.set_num_updates(model, 0)
    with torch.no_grad():
        eager_logits = _loss(model, "llama")[0]
    before = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(number):
        sparse_hf.set_num_updates(model, number)
        logits, loss = _loss(compiled, "llama")
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return logits.detach()

    # The training graph alone is compiled: a no_grad call would compile an inference graph too.
    torch.testing.assert_close(step(0), eager_logits, rtol=1e-5, atol=1e-6)
    graphs, frames = counters["stats"]["unique_graphs"], counters["frames"]["total"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        for number in range(1, 20):
            step(number)
    assert (counters["stats"]["unique_graphs"], counters["frames"]["total"]) == (graphs, frames)
    assert sum(counters["graph_break"].values()) == 0
    statistics = sparse_hf.learned_alpha_statistics(model)["decoder_self"]
    assert statistics["max"] > 1.0  # warmed up: each head's own alpha, no longer softmax's 1
    after = [row["alpha"] for row in sparse_hf.alpha_table(model)]
    assert all(new != old for new, old in zip(after, before))
