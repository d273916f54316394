"""A small Marian translation model (transformers) with sparse attention, on the toy pair.

    .venv/bin/python -m examples.huggingface.marian_toy           # about 3 minutes on 2 cores
    .venv/bin/python -m examples.huggingface.marian_toy --tiny    # seconds: the test suite's size

Builds a Marian from a config (no model hub) and trains it with transformers' Seq2SeqTrainer on
the quickstart's generated toy pair (examples.quickstart.toy_language, no download), once with
each of softmax, 1.5-entmax, learned alpha-entmax and top-k attention, and prints sacreBLEU's
BLEU and chrF on the test split and the learned alphas. Then the softmax model is saved as a
pretrained model would be (save_pretrained), read back from that directory, sparsified to
learned alpha-entmax with a warm-up from softmax (alpha_warmup_updates, AlphaWarmupCallback)
and fine-tuned; its BLEU is printed before and after. docs/huggingface.md explains the API.
"""

import argparse
import tempfile
from pathlib import Path

import sacrebleu
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.utils import logging as transformers_logging

import fairseq_entmax.huggingface as sparse_hf
from examples.quickstart.toy_language import SOURCE_LANG, TARGET_LANG, write_toy_corpus

# "demo" takes a few minutes on 2 CPU cores (4,400 Trainer steps of 64 pairs; the run is in
# docs/huggingface.md); "tiny" is the test suite's size, seconds, where BLEU says nothing.
SIZES = {
    "demo": {
        "n_train": 8000,
        "n_test": 200,
        "layers": 2,
        "dim": 64,
        "ffn": 128,
        "heads": 4,
        "topk": 4,
        "steps": 1000,
        "finetune_steps": 400,
        "warmup_updates": 100,
        "batch": 64,
        "lr": 3e-3,
    },
    "tiny": {
        "n_train": 64,
        "n_test": 8,
        "layers": 1,
        "dim": 16,
        "ffn": 32,
        "heads": 2,
        "topk": 2,
        "steps": 4,
        "finetune_steps": 4,
        "warmup_updates": 2,
        "batch": 16,
        "lr": 3e-3,
    },
}

# (row label, attention name, sparsify options or None for a fixed map).
NORMALIZERS = (
    ("softmax", "softmax", None),
    ("entmax15", "entmax15", None),
    ("alpha_entmax", "alpha_entmax", {"alpha_init": "random"}),
    ("topk", "topk", "topk"),
)
SPECIAL_TOKENS = ("<pad>", "</s>", "<unk>")
MAX_LENGTH = 40


def build_tokenizer(lines):
    """A word-level tokenizer shared by both languages (the toy pair is made of whole words), with </s> after
    every sentence, as Marian's tokenizers add it.

    Args: lines: the training sentences of both sides.
    Returns: A transformers PreTrainedTokenizerFast.
    """
    words = sorted({word for line in lines for word in line.split()})
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS + tuple(words))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", vocab["</s>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def build_model(tokenizer, size, attn_implementation, seed=0):
    """A Marian with random weights, built from a config.

    Args: tokenizer: the shared tokenizer (its vocabulary and special tokens); size: a value of SIZES;
    attn_implementation: the attention it is built with; seed: the seed of its weights.
    Returns: The MarianMTModel.
    """
    config = MarianConfig(
        vocab_size=len(tokenizer),
        d_model=size["dim"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn"],
        decoder_ffn_dim=size["ffn"],
        max_position_embeddings=MAX_LENGTH + 8,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        dropout=0.1,
        attention_dropout=0.0,
        share_encoder_decoder_embeddings=True,
        # As OPUS-MT's models do: unscaled, token embeddings of std 0.02 are drowned by the
        # sinusoidal positions of magnitude 1, and the model learns far more slowly.
        scale_embedding=True,
    )
    torch.manual_seed(seed)
    return MarianMTModel._from_config(config, attn_implementation=attn_implementation)


def sparse_row_model(tokenizer, size, name, options):
    """The model of one row of NORMALIZERS: a fixed map by its name, or sparsify's for options."""
    if options is None:
        return build_model(tokenizer, size, name)
    if options == "topk":
        options = {"topk": size["topk"]}
    return sparse_hf.sparsify(build_model(tokenizer, size, "softmax"), name, **options)


def encode(tokenizer, sources, targets):
    """The training examples: input_ids, attention_mask and labels, one dict per pair."""
    source_ids = tokenizer(sources, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    target_ids = tokenizer(targets, truncation=True, max_length=MAX_LENGTH)["input_ids"]
    return [
        {"input_ids": source, "attention_mask": [1] * len(source), "labels": target}
        for source, target in zip(source_ids, target_ids)
    ]


def train(model, tokenizer, examples, size, steps, output_dir, callbacks=()):
    """Train with Seq2SeqTrainer for a fixed number of optimizer steps.

    Args: model: the MarianMTModel; tokenizer: the shared tokenizer (padding in the collator); examples: what
    encode returns; size: a value of SIZES (batch size, learning rate); steps: optimizer steps; output_dir:
    the Trainer's output directory (no checkpoint is written); callbacks: TrainerCallbacks, e.g.
    sparse_hf.AlphaWarmupCallback().
    Returns: The Trainer's final training loss.
    """
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=size["batch"],
        learning_rate=size["lr"],
        warmup_steps=max(1, steps // 10),
        lr_scheduler_type="linear",
        logging_steps=max(1, steps // 5),
        save_strategy="no",
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        seed=0,
        disable_tqdm=True,
    )
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=examples, data_collator=collator, callbacks=list(callbacks)
    )
    return trainer.train().training_loss


@torch.no_grad()
def translate(model, tokenizer, sources, batch_size=64):
    """Greedy translations of `sources`, one string per sentence."""
    model.eval()
    hypotheses = []
    for start in range(0, len(sources), batch_size):
        batch = tokenizer(sources[start : start + batch_size], padding=True, return_tensors="pt").to(model.device)
        output = model.generate(**batch, max_new_tokens=MAX_LENGTH, num_beams=1, do_sample=False)
        hypotheses.extend(tokenizer.batch_decode(output, skip_special_tokens=True))
    return hypotheses


def score(model, tokenizer, sources, references):
    """sacreBLEU's corpus BLEU and chrF of the model's greedy translations."""
    hypotheses = translate(model, tokenizer, sources)
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score,
    }


def read_split(directory, split):
    """(sources, targets) of one split of the toy corpus."""
    read = lambda lang: (directory / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()  # noqa: E731
    return read(SOURCE_LANG), read(TARGET_LANG)


def run(size_name, work_dir):
    """Train and score every normalizer, then sparsify and fine-tune the saved softmax model.

    Args: size_name: a key of SIZES; work_dir: where the corpus, the saved softmax model and the Trainer's
    directories go.
    Returns: {"rows": [{"model", "bleu", "chrf", "loss"}, ...] (the four normalizers, then the fine-tuned
    model), "alphas": alpha_table of the learned alpha-entmax model, "finetune": {"bleu_before", "bleu_after",
    "alphas" (alpha_table after fine-tuning), "start_max_difference" (the largest absolute difference between
    the logits of the softmax model and of its saved, loaded and sparsified copy before fine-tuning)},
    "alpha_clamp"}.
    """
    size = SIZES[size_name]
    work_dir = Path(work_dir)
    corpus, _, _ = write_toy_corpus(
        work_dir / "corpus", n_train=size["n_train"], n_valid=1, n_test=size["n_test"], seed=0
    )
    train_sources, train_targets = read_split(corpus, "train")
    test_sources, test_targets = read_split(corpus, "test")
    tokenizer = build_tokenizer(train_sources + train_targets)
    examples = encode(tokenizer, train_sources, train_targets)

    rows, models = [], {}
    for label, name, options in NORMALIZERS:
        print(f"== training {label} ({size['steps']} steps)", flush=True)
        model = sparse_row_model(tokenizer, size, name, options)
        loss = train(model, tokenizer, examples, size, size["steps"], work_dir / "runs" / label)
        rows.append({"model": label, **score(model, tokenizer, test_sources, test_targets), "loss": loss})
        models[label] = model
    alphas = sparse_hf.alpha_table(models["alpha_entmax"])
    alpha_clamp = models["alpha_entmax"].config.sparse_attention["alpha_clamp"]

    # The softmax model as a pretrained model on disk, read back and sparsified with a warm-up.
    pretrained_dir = work_dir / "softmax-pretrained"
    models["softmax"].save_pretrained(pretrained_dir)
    tokenizer.save_pretrained(pretrained_dir)
    finetuned = sparse_hf.sparsify(
        MarianMTModel.from_pretrained(pretrained_dir),
        "alpha_entmax",
        alpha_init=1.5,
        alpha_warmup_updates=size["warmup_updates"],
    )
    start_difference = max_logit_difference(
        models["softmax"].eval(), finetuned.eval(), tokenizer, test_sources, test_targets
    )
    before = score(finetuned, tokenizer, test_sources, test_targets)
    label = "softmax -> alpha_entmax"
    print(f"== fine-tuning {label} ({size['finetune_steps']} steps, warm-up {size['warmup_updates']})", flush=True)
    loss = train(
        finetuned,
        tokenizer,
        examples,
        size,
        size["finetune_steps"],
        work_dir / "runs" / "finetune",
        callbacks=[sparse_hf.AlphaWarmupCallback()],
    )
    after = score(finetuned, tokenizer, test_sources, test_targets)
    rows.append({"model": label, **after, "loss": loss})
    return {
        "rows": rows,
        "alphas": alphas,
        "alpha_clamp": tuple(alpha_clamp),
        "finetune": {
            "bleu_before": before["bleu"],
            "bleu_after": after["bleu"],
            "alphas": sparse_hf.alpha_table(finetuned),
            "start_max_difference": start_difference,
        },
    }


@torch.no_grad()
def max_logit_difference(model_a, model_b, tokenizer, sources, targets):
    """The largest absolute difference between two models' logits on the same batch."""
    batch = tokenizer(sources[:8], text_target=targets[:8], padding=True, return_tensors="pt")
    batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return (model_a(**batch).logits - model_b(**batch).logits).abs().max().item()


def report(result):
    """The printed tables: scores per model, the learned alphas, the fine-tuning."""
    print("\n| model | BLEU | chrF | train loss |\n|---|---:|---:|---:|")
    for row in result["rows"]:
        print(f"| {row['model']} | {row['bleu']:.1f} | {row['chrf']:.1f} | {row['loss']:.3f} |")
    for title, alphas in (
        ("learned alphas (alpha_entmax)", result["alphas"]),
        ("learned alphas after fine-tuning (softmax -> alpha_entmax)", result["finetune"]["alphas"]),
    ):
        print(f"\n{title}:")
        by_layer = {}
        for row in alphas:
            by_layer.setdefault((row["attention_type"], row["layer"]), []).append(row["alpha"])
        for (attention_type, layer), values in by_layer.items():
            print(f"  {attention_type:<13} layer {layer}: " + " ".join(f"{value:.3f}" for value in values))
    finetune = result["finetune"]
    print(
        f"\nfine-tuning the saved softmax model into learned alpha-entmax: BLEU {finetune['bleu_before']:.1f} "
        f"before (warm-up start; logits differ from the softmax model by {finetune['start_max_difference']:.1e}), "
        f"{finetune['bleu_after']:.1f} after"
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="the test suite's size: seconds, BLEU says nothing")
    parser.add_argument(
        "--work-dir", type=Path, help="keep the corpus and the saved model here (default: a temporary directory)"
    )
    args = parser.parse_args(argv)
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    size_name = "tiny" if args.tiny else "demo"
    if args.work_dir is not None:
        result = run(size_name, args.work_dir)
    else:
        with tempfile.TemporaryDirectory() as work_dir:
            result = run(size_name, work_dir)
    report(result)
    return result


if __name__ == "__main__":
    main()
