"""The commands a benchmark measures, each in a process of its own: its output, its peak
memory, and the benchmark's exit status when one fails or refuses a checkpoint. The benchmarks
stand alone: they import this package and fairseq, never examples/."""

import importlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fairseq_entmax.repairs.checkpoint_safety import refusal_in

# The console scripts (fairseq-train, ...) installed beside this Python.
BIN = Path(sys.executable).parent


class CommandFailed(RuntimeError):
    """A command exited with a non-zero status; the message names it and ends with its output."""


class CheckpointRefused(RuntimeError):
    """A command refused to load a checkpoint (the plugin's repair); the message is its one line."""


@dataclass
class Finished:
    """A command that ran to its end.

    Attributes: args: the command and its arguments; output: what it wrote to stdout and stderr, interleaved;
    peak_rss_mib: the peak resident set size of its process, MiB.
    """

    args: list
    output: str
    peak_rss_mib: float


def run(args, log_path=None):
    """Run a command to its end, its output appended to a log file.

    Args: args: the command and its arguments (str() each); log_path: the log file, or None.
    Returns: Finished.
    Raises CheckpointRefused: it refused a checkpoint that could run code; CommandFailed: it exited with a
    non-zero status otherwise.
    """
    args = [str(a) for a in args]
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    output = proc.stdout.read()
    proc.stdout.close()
    # os.wait4, not Popen.wait: it also gives the child's peak memory.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a", encoding="utf-8") as log:
            log.write(f"$ {' '.join(args)}\n{output}")
    refusal = refusal_in(output) if proc.returncode != 0 else None
    if refusal is not None:
        raise CheckpointRefused(refusal)
    if proc.returncode != 0:
        tail = "\n".join(output.splitlines()[-30:])
        raise CommandFailed(f"{Path(args[0]).name} failed (exit {proc.returncode}): {' '.join(args)}\n{tail}")
    return Finished(args, output, usage.ru_maxrss / 1024)


def exit_status(main):
    """A benchmark's exit status: main's own (0 when it returns None); 2 after a refused checkpoint, as the
    command itself exits; 1 after a failed command. The message goes to stderr.

    Args: main: the benchmark, a function of no arguments.
    """
    try:
        return main() or 0
    except CheckpointRefused as error:
        print(error, file=sys.stderr)
        return 2
    except CommandFailed as error:
        print(f"error: {error}", file=sys.stderr)
        return 1


def run_measurement(program, measurements, argv=None):
    """One measurement of a benchmark program, `python -m benchmarks.PROGRAM NAME [options]`: the module of NAME
    parses the options, under that prog name.

    Args: program: the program's module name under benchmarks/; measurements: {NAME: (module under
    benchmarks/, what it measures)}; argv: the arguments (default: sys.argv[1:]).
    Returns: The exit status (exit_status's); 2 with the list of measurements for an unknown NAME, 0 for
    --help.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in measurements:
        listing = "\n".join(f"  {name:<12} {what}" for name, (_, what) in measurements.items())
        asked_help = bool(argv) and argv[0] in ("-h", "--help")
        print(
            f"usage: python -m benchmarks.{program} NAME [options]; NAME --help lists its options\n{listing}",
            file=sys.stdout if asked_help else sys.stderr,
        )
        return 0 if asked_help else 2
    module = importlib.import_module(f"benchmarks.{measurements[argv[0]][0]}")
    # The measurement's argparse names itself after sys.argv[0].
    sys.argv = [f"python -m benchmarks.{program} {argv[0]}", *argv[1:]]
    return exit_status(module.main)
