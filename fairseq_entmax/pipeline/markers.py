"""Stage bookkeeping. Stages write their outputs under one work directory and leave a
`<stage>.done` marker when they finish, so a second run skips what is finished. A marker
records the settings its stage ran with: data and models made with other settings are refused
rather than reused (the table would not be what it says), and translations or analyses of a
checkpoint that has changed are made again."""

import json
from pathlib import Path

from .tools import PipelineError


def is_done(marker):
    """Whether a stage is done.

    Args:
        marker: the stage's `<stage>.done` file.

    Returns:
        True when the marker exists.
    """
    return Path(marker).exists()


def mark_done(marker, info=None, settings=None):
    """Mark a stage done.

    Args:
        marker: the stage's `<stage>.done` file (its folder is made if missing).
        info: what the stage reports (a JSON-able dict), or None.
        settings: the settings it ran with (a JSON-able dict), or None.
    """
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    record = dict(info or {}, **({"settings": settings} if settings is not None else {}))
    Path(marker).write_text(json.dumps(record) + "\n")


def read_done(marker):
    """What a stage recorded when it finished.

    Args:
        marker: the stage's `<stage>.done` file.

    Returns:
        The marker's dict: the stage's info, and its settings under "settings".
    """
    return json.loads(Path(marker).read_text())


def _as_recorded(settings):
    """settings as a marker holds them (tuples become lists), to compare with a marker's."""
    return json.loads(json.dumps(settings))


def done_with_same_settings(marker, settings):
    """Whether a stage is done with exactly these settings.

    Args:
        marker: the stage's `<stage>.done` file.
        settings: the settings this run asks for (a JSON-able dict).

    Returns:
        True when the marker exists and records these settings.
    """
    return is_done(marker) and read_done(marker).get("settings") == _as_recorded(settings)


# Settings recorded under an earlier name: a marker written before the rename still resumes.
RENAMED_SETTINGS = {"variant": "normalizer"}


def done_with(marker, settings, what, defaults=None):
    """Whether a stage is done, refusing outputs made with other settings.

    Args:
        marker: the stage's `<stage>.done` file.
        settings: the settings this run asks for (a JSON-able dict).
        what: what the stage made, for the message (e.g. "the BPE codes").
        defaults: the value of each setting before it existed: a marker written before a
            setting was added lacks it, and stands for that value (a setting is added with
            the default that keeps the earlier behaviour).

    Returns:
        True when the marker exists (with these settings, or with none recorded).

    Raises:
        PipelineError: done with other settings; the message names what changed, since the
            outputs are not what this run asks for.
    """
    if not is_done(marker):
        return False
    recorded = read_done(marker).get("settings")
    settings = _as_recorded(settings)
    if recorded is not None:
        recorded = {RENAMED_SETTINGS.get(key, key): value for key, value in recorded.items()}
    if recorded is not None and defaults:
        recorded = {**_as_recorded({k: v for k, v in defaults.items() if k in settings}), **recorded}
    if recorded is not None and recorded != settings:
        changed = "; ".join(
            f"{key}: {recorded.get(key)!r} then, {settings.get(key)!r} now"
            for key in sorted(recorded.keys() | settings.keys())
            if recorded.get(key) != settings.get(key)
        )
        raise PipelineError(
            f"{what} in {Path(marker).parent} was made with other settings ({changed}): "
            "use another --work-dir, or delete that folder to make it again"
        )
    return True


def fingerprint(path):
    """What tells a checkpoint from its successor.

    Args:
        path: a file.

    Returns:
        {"path", "size", "modified_ns"}: its path, size and modification time.
    """
    stat = Path(path).stat()
    return {"path": str(path), "size": stat.st_size, "modified_ns": stat.st_mtime_ns}
