"""Normalizers compared over training seeds: the mean and spread of each, and the differences to a
baseline paired by seed, with their t-intervals. The reduced-scale reproduction and the paper recipes
report them when they train several seeds."""

import math
import statistics

# The scores compared with the baseline seed by seed: (result row key, column title).
PAIRED_METRICS = (
    ("bleu_tok", "tok BLEU"),
    ("bleu", "sacreBLEU"),
    ("chrf", "chrF"),
    ("best_valid_accuracy", "valid accuracy"),
)
CONFIDENCE = 0.95
BASELINE = "softmax"


def mean_spread(values, digits=2):
    """'mean ± sample standard deviation' over seeds, as the reports print it.

    Args:
        values: one value per seed; None (not measured) is left out.
        digits: decimals.

    Returns:
        The text; just the value for one seed, "-" for none.
    """
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def paired_interval(differences, confidence=CONFIDENCE):
    """The mean of paired differences with its t-interval.

    Args:
        differences: one difference per seed (normalizer minus baseline).
        confidence: the interval's coverage.

    Returns:
        {"n", "mean", "sd", "low", "high"}: the mean difference and the interval mean ± t * sd / sqrt(n),
        t the (1 + confidence) / 2 quantile of Student's t with n - 1 degrees of freedom; sd, low and high
        are None below two differences (mean too for none).
    """
    n = len(differences)
    result = {"n": n, "mean": statistics.mean(differences) if n else None, "sd": None, "low": None, "high": None}
    if n >= 2:
        from scipy.stats import t as student_t  # the examples extra, imported where an interval is made

        sd = statistics.stdev(differences)
        half = float(student_t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
        result.update(sd=sd, low=result["mean"] - half, high=result["mean"] + half)
    return result


def paired_differences(rows, metric, baseline=BASELINE):
    """Each normalizer's difference to the baseline of the same seed, with its interval.

    Args:
        rows: the result rows (model, seed and `metric` each).
        metric: the row key compared ("bleu", "chrf", "best_valid_accuracy", ...).
        baseline: the normalizer compared against.

    Returns:
        {normalizer: {"seeds", "differences", **paired_interval}} over the seeds where both the normalizer
        and the baseline have a value, normalizers in the order of the rows; a normalizer with no such seed
        is left out.
    """
    values = {}
    for row in rows:
        values.setdefault(row["model"], {})[row["seed"]] = row.get(metric)
    base = values.get(baseline, {})
    result = {}
    for normalizer, by_seed in values.items():
        if normalizer == baseline:
            continue
        seeds = sorted(s for s, v in by_seed.items() if v is not None and base.get(s) is not None)
        if seeds:
            differences = [by_seed[s] - base[s] for s in seeds]
            result[normalizer] = {"seeds": seeds, "differences": differences, **paired_interval(differences)}
    return result


def format_difference(entry, digits=2):
    """A paired difference as the report shows it.

    Args:
        entry: a normalizer's entry of paired_differences, or None.
        digits: decimals.

    Returns:
        "+0.26 [-1.23, +1.75]" (the mean and the interval), "+0.95 (1 seed)" without an interval, "-"
        without a difference.
    """
    if entry is None:
        return "-"
    mean = f"{entry['mean']:+.{digits}f}"
    if entry["low"] is None:
        return f"{mean} ({entry['n']} seed)"
    return f"{mean} [{entry['low']:+.{digits}f}, {entry['high']:+.{digits}f}]"


def paired_differences_table(rows, baseline=BASELINE):
    """The table of the differences to the baseline, one line per other normalizer.

    Args:
        rows: the result rows.
        baseline: the normalizer compared against.

    Returns:
        The Markdown lines; empty when no normalizer shares a seed with the baseline.
    """
    differences = {metric: paired_differences(rows, metric, baseline) for metric, _ in PAIRED_METRICS}
    normalizers = list(differences["bleu"])
    if not normalizers:
        return []
    lines = [
        "| model | seeds | " + " | ".join(title for _, title in PAIRED_METRICS) + " |",
        "|---|---|" + "---|" * len(PAIRED_METRICS),
    ]
    for normalizer in normalizers:
        seeds = ", ".join(str(s) for s in differences["bleu"][normalizer]["seeds"])
        cells = [format_difference(differences[metric].get(normalizer)) for metric, _ in PAIRED_METRICS]
        lines.append(f"| {normalizer} | {seeds} | " + " | ".join(cells) + " |")
    return lines


def paired_differences_section(rows, baseline=BASELINE):
    """The report's section on the differences to the baseline: a sentence saying what they are, then
    their table.

    Args:
        rows: the result rows (model, seed and the PAIRED_METRICS keys).
        baseline: the normalizer compared against.

    Returns:
        Lines, starting with a blank one; empty when no normalizer shares a seed with the baseline.
    """
    table = paired_differences_table(rows, baseline)
    if not table:
        return []
    return [
        "",
        f"Difference to {baseline} of the same seed (normalizer minus {baseline}), mean over the seeds "
        f"[{CONFIDENCE:.0%} t-interval over the paired differences, n - 1 degrees of freedom; an interval "
        "that holds 0 shows no difference at that confidence; one seed gives no interval]:",
        "",
        *table,
    ]
