"""The results table: one row per model, as Markdown that reads as plain text too."""

import math

_SHORT = {"encoder_self": "enc", "decoder_self": "dec", "cross": "cross"}


def format_table(rows, bleu_tok=False, training=False):
    """The results table.

    Args:
        rows: one dict per model, with model, bleu, chrf, bleu_tok (with `bleu_tok`),
            train_seconds, and from the analysis density ({type: mean fraction}) and alpha
            ({type: (mean, min, max)}), either of which may be missing; with `training`, what
            fairseq_entmax.pipeline.training.training_summary read (updates, best_update,
            stopped_early).
        bleu_tok: whether to show the tokenized BLEU column.
        training: whether to show how training went: the updates (and the best one's) and
            whether the patience or the update cap stopped it.

    Returns:
        A Markdown table, readable as plain text too.
    """
    # Imported here: importing fairseq_entmax imports fairseq (seconds), which the stages
    # that only check what is done do not need.
    from fairseq_entmax.names import ATTENTION_TYPES

    header = ["model"] + (["tok BLEU"] if bleu_tok else []) + ["BLEU", "chrF"]
    header += [f"density {_SHORT[t]}" for t in ATTENTION_TYPES]
    header += [f"alpha {_SHORT[t]} mean (min-max)" for t in ATTENTION_TYPES]
    header += ["train time"] + (["updates (best)", "stopped by"] if training else [])
    lines = [header]
    for row in rows:
        density = row.get("density") or {}
        alpha = row.get("alpha") or {}
        cells = [row["model"]] + ([f"{row['bleu_tok']:.2f}"] if bleu_tok else [])
        cells += [f"{row['bleu']:.2f}", f"{row['chrf']:.2f}"]
        cells += [f"{density[t]:.3f}" if t in density else "-" for t in ATTENTION_TYPES]
        cells += [
            f"{alpha[t][0]:.2f} ({alpha[t][1]:.2f}-{alpha[t][2]:.2f})" if t in alpha else "-" for t in ATTENTION_TYPES
        ]
        cells.append(format_seconds(row["train_seconds"]))
        if training:
            updates = "-" if row.get("updates") is None else str(row["updates"])
            if row.get("best_update") is not None:
                updates += f" ({row['best_update']})"
            cells += [updates, "patience" if row.get("stopped_early") else "cap"]
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def format_seconds(seconds):
    """A duration as the tables show it.

    Args:
        seconds: a number of seconds, or None or NaN (unknown).

    Returns:
        "1m05s", "42s", or "-" when unknown.
    """
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"
