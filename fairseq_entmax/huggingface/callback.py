"""transformers' Trainer and the learned alphas: the warm-up follows the optimizer steps, the
log lines carry the alphas."""

from transformers import PreTrainedModel, TrainerCallback

from fairseq_entmax.huggingface.models import learned_alpha_statistics, set_num_updates
from fairseq_entmax.names import ALPHA_STATISTICS, alpha_metric_name


class AlphaWarmupCallback(TrainerCallback):
    """A TrainerCallback for models that sparsify changed.

    - At the start of training and after every optimizer step it calls set_num_updates with
      the Trainer's global step, so that an `alpha_warmup_updates` warm-up follows the
      optimizer steps (also when training resumes from a checkpoint).
    - Every log line gets alpha_<type>_mean/min/max for each attention type with learned
      alphas, as the fairseq layer logs them (fairseq_entmax.names): in the logs the Trainer
      prints and in `trainer.state.log_history`, and in what the callbacks after this one
      receive. transformers runs its reporting integrations (`report_to`) before the callbacks
      given to the Trainer; to send the alphas there too, put this callback first:
      `trainer.callback_handler.callbacks.insert(0, AlphaWarmupCallback())`.

    Usage: `Trainer(model=model, ..., callbacks=[AlphaWarmupCallback()])`.
    """

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_num_updates(_unwrapped(model), state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if model is not None:
            set_num_updates(_unwrapped(model), state.global_step)

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if model is None or logs is None:
            return
        model = _unwrapped(model)
        alphas = {
            alpha_metric_name(attention_type, statistic): round(values[statistic], 4)
            for attention_type, values in learned_alpha_statistics(model).items()
            for statistic in ALPHA_STATISTICS
        }
        logs.update(alphas)
        if state.log_history:
            state.log_history[-1].update(alphas)


def _unwrapped(model):
    """The PreTrainedModel inside a wrapper (torch's DataParallel and the like keep it as .module)."""
    while not isinstance(model, PreTrainedModel) and hasattr(model, "module"):
        model = model.module
    return model
