"""Sparse attention for Hugging Face transformers models.

Importing this package registers every normalizer of fairseq_entmax.normalizers ("softmax",
"sparsemax", "entmax15", "alpha_entmax", "topk") as an attention implementation of
transformers (AttentionInterface, with its mask in AttentionMaskInterface):

    import fairseq_entmax.huggingface as sparse_hf
    model = MarianMTModel.from_pretrained(path, attn_implementation="entmax15")
    model = sparse_hf.sparsify(model, "alpha_entmax", alpha_init=1.5, alpha_warmup_updates=1000)
    trainer = Seq2SeqTrainer(model=model, ..., callbacks=[sparse_hf.AlphaWarmupCallback()])
    model.save_pretrained(out)
    model = sparse_hf.from_pretrained(MarianMTModel, out)
    rows = sparse_hf.alpha_table(model)

Needs torch and transformers (the `huggingface` extra); docs/huggingface.md says what is
supported.
"""

import importlib.util

INSTALL_HINT = (
    "transformers is not installed. fairseq_entmax.huggingface needs it: "
    "`pip install 'fairseq-entmax[huggingface]'` (or `pip install -e '.[huggingface]'` in a checkout)."
)

if importlib.util.find_spec("transformers") is None:
    raise ImportError(INSTALL_HINT)

from fairseq_entmax.huggingface.attention import (  # noqa: E402
    ATTENTION_FUNCTIONS,
    NORMALIZER_ATTRIBUTE,
    SPARSIFIED,
    register_attention_functions,
    sparse_attention_forward,
    sparse_attention_mask,
)
from fairseq_entmax.huggingface.callback import AlphaWarmupCallback  # noqa: E402
from fairseq_entmax.huggingface.models import (  # noqa: E402
    CONFIG_KEY,
    alpha_table,
    attention_modules,
    capture_attention_weights,
    from_pretrained,
    learned_alpha_statistics,
    set_num_updates,
    sparsify,
)

register_attention_functions()

__all__ = [
    "ATTENTION_FUNCTIONS",
    "CONFIG_KEY",
    "NORMALIZER_ATTRIBUTE",
    "SPARSIFIED",
    "AlphaWarmupCallback",
    "alpha_table",
    "attention_modules",
    "capture_attention_weights",
    "from_pretrained",
    "learned_alpha_statistics",
    "register_attention_functions",
    "set_num_updates",
    "sparse_attention_forward",
    "sparse_attention_mask",
    "sparsify",
]
