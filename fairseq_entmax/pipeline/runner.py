"""An experiment is a list of steps, and one runner executes them. Each step owns what it runs:
a command line, or a Python call with the line it stands for (a shell command, or a comment
naming the function). `--dry-run` prints the lines; a run executes the steps in order.

A run appends what it executed to <work>/commands.log (tools.recording_commands): each command
exactly as it ran (from `tools.run_logged`, the one place that runs commands) and each Python
step it completed. A fresh run's log therefore equals its dry run's lines, which the tests
check; a rerun lists only what it did again."""

import shlex
from dataclasses import dataclass

from . import tools


@dataclass(frozen=True)
class Step:
    """One step of an experiment.

    Attributes:
        line: the command, shell-quoted, or for a Python call the line it stands for.
        action: what the run calls, without arguments; a command step's action runs `line`'s
            command through tools.run_logged (where that command is recorded).
        is_command: whether `line` is a command that the action runs.
        skip: a function saying whether the run skips the step (its work is done with the same
            settings, or what it needs is missing), or None: never skipped.
    """

    line: str
    action: object
    is_command: bool = False
    skip: object = None


def command_step(command, action, skip=None):
    """A step that runs a command.

    Args:
        command: the command, a list of str, as the action runs it.
        action: runs it (through tools.run_logged) and does what comes with it (markers, logs).
        skip: see Step.

    Returns:
        A Step whose line is the command quoted as a shell takes it.
    """
    return Step(shlex.join(command), action, is_command=True, skip=skip)


def call_step(line, action, skip=None):
    """A step done in Python.

    Args:
        line: the shell command it stands for, or a comment line "# <stage>: what it does
            (module.function)".
        action: the call.
        skip: see Step.

    Returns:
        A Step.
    """
    return Step(line, action, skip=skip)


def dry_run(steps, header=None):
    """Print each step's line, in order, as a shell would run them.

    Args:
        steps: the Steps.
        header: a first comment line (the experiment, its devices and work dir), or None.
    """
    lines = ([header] if header else []) + [step.line for step in steps]
    print("\n".join(lines), flush=True)


def run_steps(steps):
    """Execute the steps in order. Within tools.recording_commands, what ran is recorded.

    Args:
        steps: the Steps (a generator may build later steps from what earlier ones made).
    """
    for step in steps:
        if step.skip is not None and step.skip():
            continue
        step.action()
        # A command step's command is recorded by run_logged as it starts; a Python step once done.
        if not step.is_command:
            tools.record_command(step.line)
