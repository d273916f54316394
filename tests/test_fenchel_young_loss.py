"""The entmax (Fenchel-Young) loss of the output layer, in pure torch, and the entmax_loss
criterion's metrics on hand-built scores.

Values and gradients against the entmax package's losses and fairseq's label-smoothed
cross-entropy in float64; the support size where it is known; memory (what the backward keeps);
half precision; bad input."""

import argparse
import math

import pytest
import torch

from fairseq_entmax.losses import fenchel_young_loss

pytestmark = pytest.mark.usefixtures("fairseq_plugin")

try:
    from entmax.losses import Entmax15Loss, EntmaxBisectLoss, SparsemaxLoss
except ImportError:
    Entmax15Loss = None
requires_entmax = pytest.mark.requires(
    Entmax15Loss is not None, "the entmax package (test extra, `make setup`) is not installed"
)

PAD = 1
ROWS, VOCAB = 37, 301


def _scores_and_target(seed, dtype=torch.float64, scale=3.0):
    torch.manual_seed(seed)
    logits = torch.randn(ROWS, VOCAB, dtype=dtype) * scale
    target = torch.randint(0, VOCAB, (ROWS,))
    target[::5] = PAD  # padding rows, ignored
    target[1] = logits[1].argmin()  # a target outside the support of every sparse map
    return logits, target


def _loss_and_grad(fn, logits, upstream):
    logits = logits.detach().clone().requires_grad_()
    loss = fn(logits)
    (grad,) = torch.autograd.grad(loss, logits, upstream)
    return loss.detach(), grad


def _reference(alpha):
    """The entmax package's loss of alpha (or cross-entropy at 1), one value per row, ignoring PAD."""
    if alpha == 1.0:
        return lambda x, y: torch.nn.functional.cross_entropy(x, y, ignore_index=PAD, reduction="none")
    if alpha == 2.0:
        return SparsemaxLoss(k=None, ignore_index=PAD, reduction="none")
    if alpha == 1.5:
        return Entmax15Loss(k=None, ignore_index=PAD, reduction="none")
    return EntmaxBisectLoss(alpha=alpha, n_iter=100, ignore_index=PAD, reduction="none")


@requires_entmax
@pytest.mark.parametrize("alpha", [1.0, 1.25, 1.5, 1.75, 2.0])
def test_loss_and_gradient_agree_with_entmax_package(alpha):
    reference = _reference(alpha)
    for seed in range(3):
        logits, target = _scores_and_target(seed)
        upstream = torch.randn(ROWS, dtype=torch.float64)
        mine = _loss_and_grad(
            lambda x, y=target: fenchel_young_loss(x, y, alpha, ignore_index=PAD).loss, logits, upstream
        )
        theirs = _loss_and_grad(lambda x, y=target: reference(x, y), logits, upstream)
        torch.testing.assert_close(mine[0], theirs[0], atol=1e-10, rtol=1e-10)
        torch.testing.assert_close(mine[1], theirs[1], atol=1e-10, rtol=1e-10)


@requires_entmax
@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.3])
def test_label_smoothing_is_the_loss_of_the_smoothed_target(alpha):
    """loss(eps) = loss(0) + <e_y - q, z> with q fairseq's smoothed target (1 - eps on the
    target, eps / (V - 1) elsewhere); its gradient is p - q; at alpha = 1 it is fairseq's
    label_smoothed_nll_loss, and `unsmoothed` is the loss without smoothing."""
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    eps = 0.1
    logits, target = _scores_and_target(3)
    valid = (target != PAD).double()
    upstream = torch.randn(ROWS, dtype=torch.float64)
    q = torch.full((ROWS, VOCAB), eps / (VOCAB - 1), dtype=torch.float64)
    q.scatter_(1, target.unsqueeze(1), 1.0 - eps)
    unsmoothed = _reference(alpha)(logits, target)
    expected = unsmoothed + ((torch.nn.functional.one_hot(target, VOCAB) - q) * logits).sum(-1) * valid
    result = fenchel_young_loss(logits, target, alpha, label_smoothing=eps, ignore_index=PAD)
    torch.testing.assert_close(result.loss, expected, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(result.unsmoothed, unsmoothed, atol=1e-10, rtol=1e-10)
    _, grad = _loss_and_grad(
        lambda x: fenchel_young_loss(x, target, alpha, label_smoothing=eps, ignore_index=PAD).loss, logits, upstream
    )
    p = _probabilities(logits, alpha)
    torch.testing.assert_close(grad, (p - q) * (upstream * valid).unsqueeze(1), atol=1e-10, rtol=1e-10)
    if alpha == 1.0:
        lprobs = torch.log_softmax(logits, dim=-1)
        fairseq_loss, fairseq_nll = label_smoothed_nll_loss(lprobs, target, eps, ignore_index=PAD, reduce=True)
        torch.testing.assert_close(result.loss.sum(), fairseq_loss, atol=1e-9, rtol=1e-12)
        torch.testing.assert_close(result.unsmoothed.sum(), fairseq_nll, atol=1e-9, rtol=1e-12)


def _probabilities(logits, alpha):
    from fairseq_entmax.normalizers import alpha_entmax

    return alpha_entmax(logits, alpha)


@pytest.mark.parametrize(
    "alpha, row, support",
    [
        # sparsemax: tau = (3 + 2.5 - 1) / 2 = 2.25, p = (0.75, 0.25, 0, 0)
        (2.0, [3.0, 2.5, 0.0, -1.0], 2),
        # 1.5-entmax: p_i = [z_i / 2 - tau]^2; two tied leaders, tau = -1/sqrt(2) > -5
        (1.5, [0.0, 0.0, -10.0, -10.0], 2),
        # 1.5-entmax: one clear leader takes everything ((4/2 - tau)^2 = 1 at tau = 1 > 0 / 2)
        (1.5, [4.0, 0.0, 0.0, 0.0], 1),
        # sparsemax: tau = (0.5 - 0.4999 - 1) / 2, a second entry of probability 5e-5 counts
        (2.0, [0.5, -0.4999, -3.0, -3.0], 2),
        # alpha = 1.25 (general search): equal scores share the mass
        (1.25, [1.0, 1.0, 1.0, 1.0], 4),
        # softmax: every entry, 2e-9 included
        (1.0, [0.0, -20.0, -20.0, -20.0], 4),
    ],
)
def test_support_is_the_number_of_nonzero_probabilities(alpha, row, support):
    logits = torch.tensor([row, row, row])
    target = torch.tensor([0, PAD, 0])
    result = fenchel_young_loss(logits, target, alpha, ignore_index=PAD)
    assert result.support.tolist() == [support, 0, support]
    assert int((_probabilities(logits[0], alpha) > 0).sum()) == support


def test_padding_rows_get_zero_loss_and_zero_gradient():
    logits, target = _scores_and_target(4, dtype=torch.float32)
    logits.requires_grad_()
    result = fenchel_young_loss(logits, target, 1.5, label_smoothing=0.1, ignore_index=PAD)
    result.loss.sum().backward()
    padding = target == PAD
    assert result.loss[padding].eq(0).all() and result.unsmoothed[padding].eq(0).all()
    assert logits.grad[padding].eq(0).all()
    assert logits.grad[~padding].abs().sum(-1).gt(0).all()


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0, 1.3])
def test_backward_keeps_only_the_probabilities(alpha):
    """Memory of cross-entropy's order: the only saved tensor of the scores' size is p."""
    logits, target = _scores_and_target(5, dtype=torch.float32)
    logits.requires_grad_()
    saved = []

    def pack(tensor):
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = fenchel_young_loss(logits, target, alpha, label_smoothing=0.1, ignore_index=PAD).loss.sum()
    big = [t for t in saved if t.numel() > ROWS]
    assert len(big) == 1
    torch.testing.assert_close(big[0], _probabilities(logits.detach(), alpha))
    loss.backward()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    logits, target = _scores_and_target(6, dtype=torch.float32)
    half = logits.to(dtype).requires_grad_()
    result = fenchel_young_loss(half, target, 1.5, ignore_index=PAD)
    result.loss.sum().backward()
    assert result.loss.dtype == torch.float32 and half.grad.dtype == dtype
    reference = logits.to(dtype).float().requires_grad_()
    expected = fenchel_young_loss(reference, target, 1.5, ignore_index=PAD)
    expected.loss.sum().backward()
    torch.testing.assert_close(result.loss, expected.loss)
    torch.testing.assert_close(half.grad, reference.grad.to(dtype))


def test_any_leading_shape():
    logits, target = _scores_and_target(7)
    flat = fenchel_young_loss(logits, target, 1.5, ignore_index=PAD)
    shaped = fenchel_young_loss(logits[:36].view(4, 9, VOCAB), target[:36].view(4, 9), 1.5, ignore_index=PAD)
    assert shaped.loss.shape == (4, 9)
    torch.testing.assert_close(shaped.loss.reshape(-1), flat.loss[:36])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(alpha=0.5), "finite number >= 1"),
        (dict(alpha=math.nan), "finite number >= 1"),
        (dict(alpha=math.inf), "finite number >= 1"),
        (dict(alpha=1.5, label_smoothing=1.0), r"\[0, 1\)"),
        (dict(alpha=1.5, label_smoothing=-0.1), r"\[0, 1\)"),
    ],
)
def test_bad_alpha_and_smoothing_are_refused(kwargs, message):
    logits, target = _scores_and_target(8)
    with pytest.raises(ValueError, match=message):
        fenchel_young_loss(logits, target, **kwargs)


def test_bad_shapes_are_refused():
    logits, target = _scores_and_target(8)
    with pytest.raises(ValueError, match="target must be an integer tensor of shape"):
        fenchel_young_loss(logits, target[:-1], 1.5)
    with pytest.raises(ValueError, match="target must be an integer tensor"):
        fenchel_young_loss(logits, target.double(), 1.5)


# ---------------------------------------------------------------------------------------
# The entmax_loss criterion on hand-built scores: what it logs.


class _FixedScores(torch.nn.Module):
    """A stand-in for a fairseq model: returns fixed scores, decodes with `output_alpha`."""

    def __init__(self, logits, output_alpha):
        super().__init__()
        self.logits = logits
        self.output_alpha = output_alpha

    def forward(self, **net_input):
        return self.logits, None

    def get_targets(self, sample, net_output):
        return sample["target"]


def _criterion(alpha, **kwargs):
    from fairseq.data import Dictionary

    from fairseq_entmax.criterions.entmax_loss import EntmaxLossCriterion

    task = argparse.Namespace(target_dictionary=Dictionary())  # pad index 1, as PAD
    assert task.target_dictionary.pad() == PAD
    return EntmaxLossCriterion(task, sentence_avg=False, loss_alpha=alpha, **kwargs)


def _logged(criterion, logging_outputs):
    from fairseq.logging import metrics

    with metrics.aggregate() as aggregator:
        type(criterion).reduce_metrics(logging_outputs)
        return aggregator.get_smoothed_values()


def test_criterion_logs_mean_support_per_target_token_and_accuracy():
    """Two batches (as from two workers) of known support: sparsemax rows of support 2
    and 1; a padding row counts for nothing."""
    batches = [
        # (the padding row's argmax is the padding index: it must not count as correct)
        (torch.tensor([[[3.0, 2.5, 0.0, -1.0], [0.0, 0.0, 5.0, 0.0], [0.0, 9.0, 0.0, 0.0]]]), [[0, 3, PAD]]),
        (torch.tensor([[[3.0, 2.5, 0.0, -1.0]]]), [[3]]),
    ]
    criterion = _criterion(2.0, report_accuracy=True)
    outputs = []
    for logits, target in batches:
        sample = {"net_input": {}, "target": torch.tensor(target), "ntokens": int((torch.tensor(target) != PAD).sum())}
        loss, sample_size, logging_output = criterion(_FixedScores(logits, 2.0), sample)
        assert sample_size == sample["ntokens"]
        outputs.append(logging_output)
    logged = _logged(criterion, outputs)
    assert logged["output_support"] == round((2 + 1 + 2) / 3, 2)  # logged to 2 decimals
    assert logged["accuracy"] == pytest.approx(100 / 3, abs=1e-3)  # only the first token is the argmax
    # sparsemax loss <p - e_y, z> + (1 - |p|^2) / 2: p = (0.75, 0.25, 0, 0) gives 2.875 + 0.1875
    # - z_y, 0.0625 on target 0 and 4.0625 on target 3; p = e_2 on target 3 gives 5 - 0
    assert logged["loss"] == pytest.approx(round((0.0625 + 5 + 4.0625) / 3 / math.log(2), 3))
    assert "nll_loss" not in logged  # no likelihood at alpha > 1


def test_criterion_at_alpha_one_logs_what_label_smoothed_cross_entropy_logs():
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion

    torch.manual_seed(9)
    logits = torch.randn(2, 5, 11) * 3
    target = torch.randint(2, 11, (2, 5))
    target[1, 3:] = PAD
    sample = {"net_input": {}, "target": target, "ntokens": int((target != PAD).sum())}
    ours = _criterion(1.0, label_smoothing=0.1, report_accuracy=True)
    theirs = LabelSmoothedCrossEntropyCriterion(ours.task, False, 0.1, report_accuracy=True)

    class Softmax(_FixedScores):
        def get_normalized_probs(self, net_output, log_probs, sample=None):
            return torch.log_softmax(net_output[0], dim=-1)

    model = Softmax(logits, None)  # fairseq's own models do not say: softmax
    mine, their = (criterion(model, sample) for criterion in (ours, theirs))
    torch.testing.assert_close(mine[0], their[0])
    mine_logged, their_logged = _logged(ours, [mine[2]]), _logged(theirs, [their[2]])
    for key in ("loss", "nll_loss", "ppl", "accuracy"):
        assert mine_logged[key] == pytest.approx(their_logged[key]), key
    assert mine_logged["output_support"] == 11


def test_criterion_refuses_a_model_that_decodes_with_another_map():
    criterion = _criterion(1.5)
    sample = {"net_input": {}, "target": torch.tensor([[2]]), "ntokens": 1}
    for decodes_with, named in ((None, "decodes with softmax"), (2.0, r"decodes with alpha = 2.0")):
        with pytest.raises(ValueError, match=f"{named}.*--arch adaptively_sparse_transformer"):
            criterion(_FixedScores(torch.zeros(1, 1, 4), decodes_with), sample)


@pytest.mark.parametrize("text", ["0.5", "nan", "inf", "x"])
def test_bad_loss_alpha_is_an_argument_error(text):
    from fairseq_entmax.criterions.entmax_loss import parse_label_smoothing, parse_loss_alpha

    with pytest.raises(argparse.ArgumentTypeError, match="numbers >= 1"):
        parse_loss_alpha(text)
    assert parse_loss_alpha("1") == 1.0 and parse_loss_alpha("1.5") == 1.5
    with pytest.raises(argparse.ArgumentTypeError, match=r"\[0, 1\)"):
        parse_label_smoothing("1")
