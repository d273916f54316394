"""analysis.json and the CSV tables."""

import csv
import json
import re
from pathlib import Path

from fairseq_entmax.names import ATTENTION_TYPES


def file_label(name):
    """A model name made safe for a file name (the figures carry it).

    Args:
        name: the model's name.

    Returns:
        The name with every run of other characters than letters, digits, "_", "." and "-"
        replaced by "_" ("model" if nothing is left).
    """
    return re.sub(r"[^\w.-]+", "_", name).strip("_") or "model"


# table file -> (key of the model entry, columns after "model")
TABLES = {
    "alpha.csv": ("alpha", ("attention", "layer", "head", "alpha")),
    "density_heads.csv": ("density", ("attention", "layer", "head", "fraction", "count")),
    "density_layers.csv": ("density_layers", ("attention", "layer", "fraction", "count")),
    "density_types.csv": ("density_types", ("attention", "fraction", "count")),
    "js.csv": ("js", ("attention", "layer", "js")),
    "positional.csv": ("positional", ("attention", "layer", "head", "previous", "next")),
    "positional_heads.csv": ("positional_heads", ("attention", "layer", "head", "direction", "weight")),
    "bpe_merging.csv": ("bpe_merging", ("attention", "layer", "head", "mass")),
    "bpe_merging_heads.csv": ("bpe_merging_heads", ("attention", "layer", "head", "mass")),
    "interrogation.csv": ("interrogation", ("attention", "layer", "head", "mass")),
    "interrogation_heads.csv": ("interrogation_heads", ("attention", "layer", "head", "mass")),
}

COMPARISON_COLUMNS = (
    "model",
    "attention",
    "normalizer",
    "alpha_mean",
    "alpha_min",
    "alpha_max",
    "density_fraction",
    "density_count",
    "js_mean",
    "positional_heads",
    "bpe_merging_heads",
    "interrogation_heads",
)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def comparison_rows(models):
    """The headline numbers side by side: comparison.csv's rows.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).

    Returns:
        A list of dicts with the keys of COMPARISON_COLUMNS, one per model and attention type.
    """
    rows = []
    for model in models:
        for attention in ATTENTION_TYPES:
            if attention not in model["normalizers"]:
                continue
            alphas = [r["alpha"] for r in model["alpha"] if r["attention"] == attention and r["alpha"] is not None]
            density = next(r for r in model["density_types"] if r["attention"] == attention)
            rows.append(
                dict(
                    model=model["name"],
                    attention=attention,
                    normalizer=model["normalizers"][attention],
                    alpha_mean=_mean(alphas),
                    alpha_min=min(alphas, default=None),
                    alpha_max=max(alphas, default=None),
                    density_fraction=density["fraction"],
                    density_count=density["count"],
                    js_mean=_mean([r["js"] for r in model["js"] if r["attention"] == attention]),
                    positional_heads=sum(r["attention"] == attention for r in model["positional_heads"]),
                    bpe_merging_heads=sum(r["attention"] == attention for r in model["bpe_merging_heads"]),
                    interrogation_heads=sum(r["attention"] == attention for r in model["interrogation_heads"]),
                )
            )
    return rows


def _write_csv(path, columns, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})


def write_tables(models, output_dir):
    """Write the CSV tables: those of TABLES and comparison.csv, all models in each, first
    column `model`.

    Args:
        models: the models' entries of analysis.json (docs/analysis.md).
        output_dir: where the tables are written.

    Returns:
        The paths written, a list.
    """
    output_dir = Path(output_dir)
    written = []
    for filename, (key, columns) in TABLES.items():
        rows = [dict(row, model=model["name"]) for model in models for row in model[key]]
        _write_csv(output_dir / filename, ("model",) + columns, rows)
        written.append(output_dir / filename)
    _write_csv(output_dir / "comparison.csv", COMPARISON_COLUMNS, comparison_rows(models))
    written.append(output_dir / "comparison.csv")
    return written


def write_json(analysis, output_dir):
    """Write analysis.json.

    Args:
        analysis: {"models": [...]}, each model's entry as analyze_checkpoint returns it.
        output_dir: where analysis.json is written.

    Returns:
        The path of analysis.json.
    """
    path = Path(output_dir) / "analysis.json"
    path.write_text(json.dumps(analysis, indent=1) + "\n", encoding="utf-8")
    return path
