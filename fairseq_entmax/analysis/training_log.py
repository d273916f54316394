"""Alpha trajectories over training, read from what fairseq-train wrote.

Two sources, as the fairseq layer logs them:
- the training log (fairseq's log lines in `simple` or `json` format, e.g. from --log-file or
  a saved stdout): `alpha_<type>_mean`, `alpha_<type>_min`, `alpha_<type>_max` per logged step;
- a --tensorboard-logdir: the same plus per-head scalars `alpha_<type>_L<layer>_H<head>`.

Each trajectory is a dict {attention, statistic, layer, head, steps, values}: statistic is
"mean", "min", "max" or "head" (then layer and head are set, else they are None); steps are
num_updates.
"""
import json
import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)

_ALPHA_KEY = re.compile(r"^alpha_(encoder_self|decoder_self|cross)_(?:(mean|min|max)|L(\d+)_H(\d+))$")
# What fairseq's console logging puts before a message: "2024-01-01 12:00:00 | INFO | train_inner | ".
# Its --log-file gets the bare message, so the stats' kind is told from the message itself.
_LOGGING_PREFIX = re.compile(r"^.*?\| [A-Z]+ \| [\w.]+ \| ")
# simple format, every --log-interval updates: "epoch 001:     10 / 20 loss=3.2, ..., num_updates=10"
_SIMPLE_INNER = re.compile(r"^epoch \d+:\s+\d+ / \d+ (.*)$")
# Kinds of stats lines, most frequent first: one kind is enough, the others repeat the same alphas.
_TAGS = ("train_inner", "train", "valid")


def _parse_alpha_key(key):
    match = _ALPHA_KEY.match(key)
    if match is None:
        return None
    attention, statistic, layer, head = match.groups()
    if statistic is None:
        return attention, "head", int(layer), int(head)
    return attention, statistic, None, None


def _stats_of_line(line):
    """(kind, stats) of a fairseq stats line, kind being train_inner (every --log-interval
    updates), train or valid (end of epoch); None for other lines. Reads the simple and the json
    format, with or without the logging prefix."""
    line = line.strip()
    prefix = _LOGGING_PREFIX.match(line)
    payload = line[prefix.end():] if prefix else line
    if payload.startswith("{"):
        try:
            stats = json.loads(payload)
        except json.JSONDecodeError:
            return None
        # end-of-epoch json lines prefix every key with train_ / valid_
        for tag in ("train", "valid"):
            if f"{tag}_num_updates" in stats:
                return tag, {k[len(tag) + 1:] if k.startswith(tag + "_") else k: v for k, v in stats.items()}
        return "train_inner", stats
    inner = _SIMPLE_INNER.match(payload)
    if inner:
        return "train_inner", dict(re.findall(r"([\w./-]+)=([^,\s]+)", inner.group(1)))
    if payload.startswith("epoch ") and " | " in payload:  # "epoch 001 | loss 3.2 | ..." (end of epoch)
        parts = payload.split(" | ")[1:]
        tag = "valid" if parts and parts[0].startswith("valid on") else "train"
        return tag, {key: value for key, _, value in (part.strip().partition(" ") for part in parts)}
    return None


def _to_float(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _collect(records):
    """records: iterable of (step, key, value) -> list of trajectories sorted by key."""
    series = {}
    for step, key, value in records:
        parsed = _parse_alpha_key(key)
        if parsed is None or value is None or step is None:
            continue
        series.setdefault(parsed, {})[step] = value  # a later line for the same step wins
    trajectories = []
    order = {name: i for i, name in enumerate(("encoder_self", "decoder_self", "cross", "mean", "min", "max", "head"))}
    for (attention, statistic, layer, head), points in sorted(
        series.items(),
        key=lambda item: (order[item[0][0]], order[item[0][1]], item[0][2] or 0, item[0][3] or 0),
    ):
        steps = sorted(points)
        trajectories.append(dict(
            attention=attention, statistic=statistic, layer=layer, head=head,
            steps=steps, values=[points[s] for s in steps],
        ))
    return trajectories


def read_log_file(path):
    """Alpha trajectories from a fairseq training log file."""
    by_tag = {tag: [] for tag in _TAGS}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parsed = _stats_of_line(line) if "alpha_" in line else None
            if parsed is None:
                continue
            tag, stats = parsed
            step = _to_float(stats.get("num_updates"))
            for key, value in stats.items():
                by_tag[tag].append((None if step is None else int(step), key, _to_float(value)))
    for tag in _TAGS:
        trajectories = _collect(by_tag[tag])
        if trajectories:
            return trajectories
    return []


def read_tensorboard(logdir):
    """Alpha trajectories from a fairseq --tensorboard-logdir (its train_inner/train/valid runs)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = Path(logdir)
    for tag in _TAGS:
        run_dir = logdir / tag
        if not run_dir.is_dir():
            continue
        accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
        accumulator.Reload()
        records = [
            (event.step, key, float(event.value))
            for key in accumulator.Tags().get("scalars", [])
            if _parse_alpha_key(key) is not None
            for event in accumulator.Scalars(key)
        ]
        trajectories = _collect(records)
        if trajectories:
            return trajectories
    return []


def read_trajectories(path):
    """Alpha trajectories from a log file or a tensorboard log directory ([] if it has none)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"training log {path} does not exist")
    trajectories = read_tensorboard(path) if path.is_dir() else read_log_file(path)
    if not trajectories:
        logger.info("no alpha_<type>_* values in %s (a model without learned alpha logs none)", path)
    return trajectories
