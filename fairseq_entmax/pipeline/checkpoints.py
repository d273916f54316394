"""Averages of a finished run's checkpoints (read through fairseq_entmax's safe loader)."""

import re
from pathlib import Path

from .tools import PipelineError, log


def _checkpoint_order(path):
    """Sort key of fairseq's checkpoint names: checkpoint{epoch}.pt, checkpoint_{epoch}_{update}.pt."""
    numbers = [int(n) for n in re.findall(r"\d+", path.stem)]
    return numbers[-1] if numbers else -1


def _load(path):
    """A checkpoint's state, read with torch's safe unpickler and the allowlist of fairseq's
    checkpoint types: a checkpoint holding anything else raises PipelineError (the refusal's
    line, exit status 2) and nothing of it runs."""
    from fairseq_entmax.repairs.checkpoint_safety import UnsafeCheckpointError, load_checkpoint_safely

    try:
        return load_checkpoint_safely(path, map_location="cpu")
    except UnsafeCheckpointError as error:
        raise PipelineError(str(error)) from error


def _num_updates(path):
    return _load(path)["optimizer_history"][-1]["num_updates"]


def last_checkpoints(save_dir, n):
    """The most recent states of a run: its numbered checkpoints (update-interval ones if
    there are any), plus checkpoint_last.pt when training stopped (at --max-update) after the
    last numbered one was written, which is the usual case.

    Args:
        save_dir: the run's --save-dir.
        n: how many states.

    Returns:
        The paths of the last n of those states (fewer if the run has fewer), oldest first.
    """
    save_dir = Path(save_dir)
    by_update = sorted(save_dir.glob("checkpoint_*_*.pt"), key=_checkpoint_order)
    by_epoch = sorted(
        (p for p in save_dir.glob("checkpoint*.pt") if re.fullmatch(r"checkpoint\d+", p.stem)), key=_checkpoint_order
    )
    numbered = by_update or by_epoch
    last = save_dir / "checkpoint_last.pt"
    if last.exists() and (not numbered or _num_updates(last) > _num_updates(numbered[-1])):
        numbered = numbered + [last]
    return numbered[-n:]


def average_checkpoints(paths, out_path):
    """Average the model parameters of several checkpoints of one run (fairseq's
    scripts/average_checkpoints.py is not installed by pip). Everything but the parameters
    (config, optimizer history) is taken from the last checkpoint.

    Args:
        paths: the checkpoints, the last one last.
        out_path: where the averaged checkpoint is written.

    Raises:
        PipelineError: a checkpoint holds a pickled object outside fairseq's checkpoint types
            (nothing of it ran).
    """
    from fairseq import checkpoint_utils

    summed, last = None, None
    for path in paths:
        state = _load(path)
        params = state["model"]
        if summed is None:
            summed = {k: v.double() if v.is_floating_point() else v for k, v in params.items()}
        else:
            for k, v in params.items():
                if v.is_floating_point():
                    summed[k] = summed[k] + v.double()
        last = state
    for k, v in last["model"].items():
        last["model"][k] = (summed[k] / len(paths)).to(v.dtype) if v.is_floating_point() else v
    checkpoint_utils.torch_persistent_save(last, str(out_path))


def averaged_checkpoint(save_dir, n, label):
    """The average of the last states of a finished run (made once).

    Args:
        save_dir: the run's --save-dir.
        n: how many states to average (last_checkpoints).
        label: the run's name in progress lines.

    Returns:
        The path of checkpoint_avg{n}.pt (of a run with a single state, that state).
    """
    save_dir = Path(save_dir)
    out = save_dir / f"checkpoint_avg{n}.pt"
    if out.exists():
        return out
    paths = last_checkpoints(save_dir, n)
    # A run with a single state averages it alone: the file is where the dry run says.
    log(f"{label}: averaging {', '.join(p.name for p in paths)}")
    average_checkpoints(paths, out)
    return out
