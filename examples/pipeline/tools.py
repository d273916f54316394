"""Running the command-line tools the stages chain (fairseq, subword-nmt, the analysis), and
the errors and log lines a script reports. A problem the user can fix raises PipelineError,
whose message says what is wrong and what to do; a failing tool raises ToolError with the end
of its log. `run_reporting_errors` turns them into a message and an exit status."""

import os
import subprocess
import sys
import time
from pathlib import Path

BIN_DIR = Path(sys.executable).parent


class PipelineError(Exception):
    """A problem with the user's input or set-up; the message says what to do."""


class ToolError(RuntimeError):
    """A tool (fairseq, subword-nmt) failed; the message holds the end of its log."""


def run_reporting_errors(run, args):
    """Run a script's stages, turning its errors into a message and an exit status.

    Args:
        run: the script's stages, a function of `args`.
        args: the parsed command line.

    Returns:
        The exit status: 0; 2 after a PipelineError, 1 after a ToolError (its message, with the
        tool's log, on stderr).
    """
    try:
        run(args)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def log(message):
    """Print a progress line, with the time.

    Args:
        message: the line.
    """
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def tool(name):
    """Path of a console script (fairseq-train, subword-nmt, ...) installed beside this Python.

    Args:
        name: the script's name.

    Returns:
        Its path, a str.

    Raises:
        PipelineError: it is not installed there.
    """
    path = BIN_DIR / name
    if not path.exists():
        raise PipelineError(f"{name} not found in {BIN_DIR}: run `make setup` and use .venv/bin/python")
    return str(path)


def user_dir():
    """The fairseq_entmax package directory. Imported here, not at the top: importing
    fairseq_entmax imports fairseq (seconds), which the stages that only check markers and
    settings do not need.

    Returns:
        The directory, what fairseq's --user-dir is given.
    """
    from fairseq_entmax import USER_DIR

    return USER_DIR


def use_cpu():
    """Whether fairseq runs on the CPU.

    Returns:
        True when no CUDA device is visible.
    """
    import torch

    return not torch.cuda.is_available()


def run_logged(args, log_path, show=None, env=None):
    """Run a command, appending all its output to a log file.

    Args:
        args: the command and its arguments (str() each).
        log_path: the log file, appended to.
        show: a function of each output line; a line for which it returns a string prints
            that string as progress (None: nothing is printed).
        env: environment variables to set for the command, on top of this process's.

    Raises:
        PipelineError: the command refused a checkpoint (the message is its refusal).
        ToolError: the command failed otherwise; the message holds the log's last lines.
    """
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    args = [str(a) for a in args]
    # Line-buffered: the log shows each line as it comes (for a user following it, and for a
    # resume test that interrupts once a checkpoint has been logged).
    with open(log_path, "a", encoding="utf-8", buffering=1) as log_file:
        log_file.write("$ " + " ".join(args) + "\n")
        log_file.flush()
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # Unbuffered, so fairseq's log lines arrive (and show) as they are written.
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            bufsize=1,
        )
        try:
            for line in proc.stdout:
                log_file.write(line)
                shown = show(line) if show else None
                if shown:
                    print("    " + shown, flush=True)
            returncode = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if returncode != 0:
        from fairseq_entmax.repairs.checkpoint_safety import refusal_in

        # A refused checkpoint is the user's to fix: its one line, as the tool printed it.
        refusal = refusal_in(log_path.read_text(encoding="utf-8"))
        if refusal is not None:
            raise PipelineError(refusal)
        tail = "".join(log_path.read_text(encoding="utf-8").splitlines(keepends=True)[-25:])
        raise ToolError(f"{Path(args[0]).name} failed (exit {returncode}); full log in {log_path}; last lines:\n{tail}")
