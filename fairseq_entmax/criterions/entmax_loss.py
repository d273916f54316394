"""The entmax_loss criterion: sparse output distributions trained with their Fenchel-Young loss.

`fairseq-train --criterion entmax_loss --loss-alpha A` trains the output layer for alpha-entmax
(A = 1 cross-entropy, 1.5 1.5-entmax, 2 sparsemax; Peters, Niculae and Martins 2019). The model
must decode with the same map: adaptively_sparse_transformer reads --loss-alpha from its
arguments, which fairseq saves in the checkpoint, and its get_normalized_probs returns the
entmax distribution (docs/outputs.md). The criterion refuses a model that would decode with
softmax instead.
"""

import argparse
import math

from fairseq import utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.logging import metrics

from fairseq_entmax.losses import check_loss_alpha, fenchel_young_loss
from fairseq_entmax.options import parse_number_in_interval

CRITERION_NAME = "entmax_loss"
DEFAULT_LOSS_ALPHA = 1.5
# The logged mean number of vocabulary entries with nonzero probability per target token.
SUPPORT_METRIC = "output_support"


def parse_loss_alpha(text):
    """Parse --loss-alpha.

    Args:
        text: a number >= 1 (or its text).

    Returns:
        The number as a float.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    try:
        return check_loss_alpha(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"allowed values are numbers >= 1 (1 = cross-entropy, 1.5 = 1.5-entmax, 2 = sparsemax), got {text!r}"
        ) from None


def parse_label_smoothing(text):
    """Parse --label-smoothing.

    Args:
        text: a number in [0, 1) (or its text).

    Returns:
        The number as a float.

    Raises:
        argparse.ArgumentTypeError: for anything else, saying what is allowed.
    """
    return parse_number_in_interval(text, 0, 1, high_open=True)


def model_output_alpha(model):
    """The alpha of the map a model decodes with, or None if it does not say (fairseq's own
    models decode with softmax). Looks through fairseq's distributed wrappers."""
    while model is not None:
        alpha = getattr(model, "output_alpha", None)
        if alpha is not None:
            return alpha
        model = getattr(model, "module", None)
    return None


@register_criterion(CRITERION_NAME)
class EntmaxLossCriterion(FairseqCriterion):
    """The entmax (Fenchel-Young) loss of the output distribution, with label smoothing.

    Logs the loss (in bits at A = 1, where it is fairseq's label-smoothed cross-entropy; at
    A > 1 the loss divided by ln 2 likewise, which keeps it continuous in A), nll_loss and ppl at
    A = 1, where they are the likelihood's, the mean support size of the output distribution per
    target token (output_support), and with --report-accuracy the accuracy of the argmax.
    """

    def __init__(self, task, sentence_avg, loss_alpha=DEFAULT_LOSS_ALPHA, label_smoothing=0.0, report_accuracy=False):
        super().__init__(task)
        self.sentence_avg = sentence_avg
        self.loss_alpha = check_loss_alpha(loss_alpha)
        self.label_smoothing = label_smoothing
        self.report_accuracy = report_accuracy

    @classmethod
    def add_args(cls, parser):
        parser.add_argument(
            "--loss-alpha",
            type=parse_loss_alpha,
            default=DEFAULT_LOSS_ALPHA,
            metavar="A",
            help="alpha of the output distribution's entmax: 1 cross-entropy (softmax), 1.5 1.5-entmax, "
            f"2 sparsemax, any number >= 1 (default: {DEFAULT_LOSS_ALPHA})",
        )
        parser.add_argument(
            "--label-smoothing",
            type=parse_label_smoothing,
            default=0.0,
            metavar="EPS",
            help="label smoothing of the target, as label_smoothed_cross_entropy's (default: 0)",
        )
        parser.add_argument("--report-accuracy", action="store_true", help="report accuracy metric")

    def check_model(self, model):
        """Refuse a model that would not decode with this loss's map.

        Raises:
            ValueError: when the loss is not cross-entropy and the model decodes with another
                map (fairseq's transformer always decodes with softmax), or uses an adaptive
                softmax, whose output is not a full row of scores.
        """
        decoder = getattr(model, "decoder", getattr(getattr(model, "module", None), "decoder", None))
        if getattr(decoder, "adaptive_softmax", None) is not None:
            raise ValueError(
                f"--criterion {CRITERION_NAME} needs the full output scores; drop --adaptive-softmax-cutoff"
            )
        if self.loss_alpha == 1.0:
            return
        decodes_with = model_output_alpha(model)
        if decodes_with != self.loss_alpha:
            what = "softmax" if decodes_with is None else f"alpha = {decodes_with}"
            raise ValueError(
                f"--criterion {CRITERION_NAME} --loss-alpha {self.loss_alpha} trains the output distribution "
                f"for {self.loss_alpha}-entmax, but the model {type(model).__name__} decodes with {what}. Use "
                "--arch adaptively_sparse_transformer* (add --attention-normalizer softmax for softmax "
                "attention), which records --loss-alpha in its checkpoint and decodes with it."
            )

    def forward(self, model, sample, reduce=True):
        """Compute the loss for the given sample.

        Args:
            model: the model (see check_model).
            sample: a fairseq batch, with net_input, target and ntokens.
            reduce: sum the loss over the tokens (otherwise one value per target position).

        Returns:
            (loss, sample_size, logging_output), as fairseq's criteria return them.
        """
        self.check_model(model)
        net_output = model(**sample["net_input"])
        target = model.get_targets(sample, net_output)
        result = fenchel_young_loss(
            net_output[0], target, self.loss_alpha, self.label_smoothing, ignore_index=self.padding_idx
        )
        loss = result.loss.sum() if reduce else result.loss
        sample_size = sample["target"].size(0) if self.sentence_avg else sample["ntokens"]
        logging_output = {
            "loss": loss.data,
            SUPPORT_METRIC: result.support.sum().data,
            "ntokens": sample["ntokens"],
            "nsentences": sample["target"].size(0),
            "sample_size": sample_size,
        }
        if self.loss_alpha == 1.0:
            logging_output["nll_loss"] = result.unsmoothed.sum().data
        if self.report_accuracy:
            valid = target.ne(self.padding_idx)
            # the entmax of any alpha keeps the order of the scores: its argmax is theirs
            n_correct = (net_output[0].argmax(dim=-1).eq(target) & valid).sum()
            logging_output["n_correct"] = utils.item(n_correct.data)
            logging_output["total"] = utils.item(valid.sum().data)
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        """Aggregate logging outputs from data parallel training."""
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        ntokens = sum(log.get("ntokens", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        support_sum = sum(log.get(SUPPORT_METRIC, 0) for log in logging_outputs)

        metrics.log_scalar("loss", loss_sum / sample_size / math.log(2), sample_size, round=3)
        metrics.log_scalar(SUPPORT_METRIC, support_sum / max(ntokens, 1), ntokens, round=2)
        if any("nll_loss" in log for log in logging_outputs):
            nll_loss_sum = sum(log.get("nll_loss", 0) for log in logging_outputs)
            metrics.log_scalar("nll_loss", nll_loss_sum / ntokens / math.log(2), ntokens, round=3)
            metrics.log_derived("ppl", lambda meters: utils.get_perplexity(meters["nll_loss"].avg))

        total = utils.item(sum(log.get("total", 0) for log in logging_outputs))
        if total > 0:
            metrics.log_scalar("total", total)
            metrics.log_scalar("n_correct", utils.item(sum(log.get("n_correct", 0) for log in logging_outputs)))
            metrics.log_derived(
                "accuracy",
                lambda meters: (
                    round(meters["n_correct"].sum * 100.0 / meters["total"].sum, 3)
                    if meters["total"].sum > 0
                    else float("nan")
                ),
            )

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        """The logging outputs are sums: they can be summed across workers before
        reduce_metrics, which speeds up distributed training."""
        return True
