"""Running the command-line tools the stages chain (fairseq, subword-nmt, the analysis), and
the errors and log lines a script reports. A problem the user can fix raises PipelineError,
whose message says what is wrong and what to do; a failing tool raises ToolError with the end
of its log. `run_reporting_errors` turns them into a message and an exit status."""

import contextlib
import io
import os
import queue
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path


def bin_dir():
    """The folder of the console scripts the stages run (fairseq-train, subword-nmt, ...): the
    folder of this Python, a Path."""
    return Path(sys.executable).parent


# While a program records what it runs (recording_commands): the commands log, and the header
# line still to be written before the first line recorded.
_recording = None


@contextlib.contextmanager
def recording_commands(path):
    """Within the block, append every command run_logged runs, and each record_command line,
    to a file, after a line "# run of <date and time>". The file (and its folder) is made at
    the first line recorded: a run that fails before doing anything leaves nothing behind.

    Args:
        path: the file.
    """
    global _recording
    previous, _recording = _recording, {"path": Path(path), "header": f"# run of {time.strftime('%Y-%m-%d %H:%M:%S')}"}
    try:
        yield
    finally:
        _recording = previous


def record_command(line):
    """Append a line to the commands log, when one is recording (recording_commands).

    Args:
        line: the line.
    """
    if _recording is None:
        return
    path, header = _recording["path"], _recording.pop("header", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write((f"{header}\n" if header else "") + line + "\n")


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
        tool's log, on stderr); 130 after Ctrl-C (what a shell reports for SIGINT), with a line
        that says how to go on.
    """
    try:
        run(args)
    except PipelineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted: the same command again goes on from the stages and checkpoints done", file=sys.stderr)
        return 130
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
    path = bin_dir() / name
    if not path.exists():
        raise PipelineError(f"{name} not found in {path.parent}: run `make setup` and use .venv/bin/python")
    return str(path)


def use_cpu():
    """Whether fairseq runs on the CPU.

    Returns:
        True when no CUDA device is visible.
    """
    import torch

    return not torch.cuda.is_available()


@dataclass
class Finished:
    """A command that ran to its end.

    Attributes:
        args: the command and its arguments, as run.
        returncode: its exit status.
        stdout: what it wrote to stdout.
        stderr: what it wrote to stderr.
    """

    args: list
    returncode: int
    stdout: str
    stderr: str

    @property
    def output(self):
        """stdout, then stderr, for reading the lines a tool logs to either."""
        return self.stdout + self.stderr


# The console scripts that run_logged calls in this process (their `cli_main`, with the
# command's argv and streams) instead of starting them: fairseq's, whose `import fairseq` costs
# a fresh process seconds of CPU, and the analysis built on it.
IN_PROCESS_SCRIPTS = (
    "fairseq-preprocess",
    "fairseq-train",
    "fairseq-generate",
    "fairseq-interactive",
    "fairseq-entmax-analyze",
)
# fairseq's console scripts log in this format (fairseq_cli's logging.basicConfig).
FAIRSEQ_LOG_FORMAT = "%(asctime)s | %(levelname)s | %(name)s | %(message)s"


def run_logged(
    args, log_path=None, show=None, env=None, *, threads=None, cwd=None, timeout=None, input=None, check=True
):
    """Run a command, its output captured and appended to a log file as it comes.

    One of IN_PROCESS_SCRIPTS installed beside this Python runs in this process, as its console
    script would (argv, stdin, stdout, stderr, exit status), when nothing asks for a process of
    its own (env, cwd or timeout) and at most one CUDA device is visible (fairseq starts a
    process per device otherwise). Every other command runs as a process.

    Args:
        args: the command and its arguments (str() each).
        log_path: the log file, appended to, or None (no log).
        show: a function of each output line; a line for which it returns a string prints
            that string as progress (None: nothing is printed).
        env: environment variables to set for the command, on top of this process's.
        threads: CPU threads for the command (torch's, OpenMP's and MKL's), or None: torch's
            choice.
        cwd: the folder it runs in (None: this process's).
        timeout: seconds, or None; past it the command and every process it started are killed.
        input: text typed into its stdin, or None (stdin then reads nothing).
        check: raise ToolError when it exits non-zero.

    Returns:
        Finished: its exit status and output.

    Raises:
        PipelineError: (with check) the command refused a checkpoint; the message is its
            one-line refusal.
        ToolError: it ran past the timeout, or (with check) failed otherwise; the message names
            the command and holds the last lines of its output.
    """
    args = [str(a) for a in args]
    record_command(shlex.join(args))
    lines = _OutputLines(log_path, args, show)
    try:
        if env is None and cwd is None and timeout is None and _runs_in_process(args[0]):
            returncode = _call_script(args, lines, threads, input)
        else:
            returncode = _run_process(args, lines, env, threads, cwd, timeout, input)
    finally:
        lines.close()
    finished = Finished(args, returncode, "".join(lines.captured["stdout"]), "".join(lines.captured["stderr"]))
    if check and finished.returncode != 0:
        raise _failure(finished, log_path, lines.captured)
    return finished


class _OutputLines:
    """A command's output lines as they come: kept, appended to its log file, shown."""

    def __init__(self, log_path, args, show):
        self.captured = {"stdout": [], "stderr": []}
        # Progress goes where this process' stdout is now, not where the command's is.
        self.show, self.progress = show, sys.stdout
        self.lock = threading.Lock()
        self.log_file = None
        if log_path is not None:
            log_path = Path(log_path)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: the log shows each line as it comes (for a user following it, and
            # for a resume test that interrupts once a checkpoint has been logged).
            self.log_file = open(log_path, "a", encoding="utf-8", buffering=1)
            self.log_file.write("$ " + " ".join(args) + "\n")

    def add(self, name, line):
        with self.lock:
            self.captured[name].append(line)
            if self.log_file is not None:
                self.log_file.write(line)
        shown = self.show(line) if self.show else None
        if shown:
            print("    " + shown, file=self.progress, flush=True)

    def close(self):
        if self.log_file is not None:
            self.log_file.close()


class _LineWriter(io.TextIOBase):
    """A text stream that hands each complete line to _OutputLines.add: a script's stdout or
    stderr while it runs in this process."""

    def __init__(self, lines, name):
        self.lines, self.name, self.partial = lines, name, ""

    @property
    def encoding(self):
        return "utf-8"

    def writable(self):
        return True

    def write(self, text):
        *complete, self.partial = (self.partial + text).split("\n")
        for line in complete:
            self.lines.add(self.name, line + "\n")
        return len(text)

    def close(self):
        if self.partial:
            self.lines.add(self.name, self.partial)
            self.partial = ""
        super().close()


def _runs_in_process(program):
    """Whether run_logged calls `program` in this process (see run_logged)."""
    path = Path(program)
    if path.name not in IN_PROCESS_SCRIPTS or path.parent != bin_dir():
        return False
    import torch

    return torch.cuda.device_count() <= 1


def _call_script(args, lines, threads, input):
    """Run a console script's entry point in this process, as the script would run.

    Returns:
        Its exit status.
    """
    import logging
    from importlib.metadata import entry_points

    import torch

    (entry,) = entry_points(group="console_scripts", name=Path(args[0]).name)
    stdout, stderr = _LineWriter(lines, "stdout"), _LineWriter(lines, "stderr")
    root = logging.getLogger()
    saved = sys.argv, sys.stdin, root.handlers[:], root.level, torch.get_num_threads()
    # As fairseq_cli sets up logging in a fresh process (it does so only where the root logger
    # has no handler yet): to the command's stdout, from LOGLEVEL.
    handler = logging.StreamHandler(stdout)
    handler.setFormatter(logging.Formatter(FAIRSEQ_LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
    sys.argv, sys.stdin = list(args), io.StringIO(input or "")
    if threads:
        torch.set_num_threads(threads)
    _clear_fairseq_run_state()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                return _exit_status(entry.load()())
            except SystemExit as stop:
                return _exit_status(stop.code)
            except Exception as error:
                # As the interpreter ends on an uncaught exception: sys.excepthook (the plugin's
                # reports a refused checkpoint in one line and exits 2), then status 1.
                try:
                    sys.excepthook(type(error), error, error.__traceback__)
                except SystemExit as stop:
                    return _exit_status(stop.code)
                return 1
    finally:
        _clear_fairseq_run_state()
        sys.argv, sys.stdin, root.handlers[:], level, num_threads = saved
        root.setLevel(level)
        torch.set_num_threads(num_threads)
        stdout.close()
        stderr.close()


def _clear_fairseq_run_state():
    """Put fairseq's state of a run back as a fresh process has it. fairseq-train keeps the best
    validation loss and the patience count as attributes of two functions, and its tensorboard
    writers in a module's dict, which it flushes only at exit."""
    if "fairseq.checkpoint_utils" in sys.modules:
        vars(sys.modules["fairseq.checkpoint_utils"].save_checkpoint).pop("best", None)
    if "fairseq_cli.train" in sys.modules:
        for name in ("best", "num_runs"):
            vars(sys.modules["fairseq_cli.train"].should_stop_early).pop(name, None)
    if "fairseq.logging.progress_bar" in sys.modules:
        progress_bar = sys.modules["fairseq.logging.progress_bar"]
        progress_bar._close_writers()
        progress_bar._tensorboard_writers.clear()


def _exit_status(code):
    """The exit status a console script ends with, given what its `sys.exit` received."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_process(args, lines, env, threads, cwd, timeout, input):
    """Run a command as a process, its output lines handed to `lines` as they come.

    Returns:
        Its exit status.
    """
    thread_env = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    deadline = None if timeout is None else time.monotonic() + max(timeout, 1)
    proc = subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        text=True,
        cwd=cwd,
        # Unbuffered, so fairseq's log lines arrive (and show) as they are written.
        env=dict(os.environ, PYTHONUNBUFFERED="1", **thread_env, **(env or {})),
        bufsize=1,
        # A session of its own when it has a time limit: the limit kills the whole group (a
        # tool's workers too); without one, Ctrl-C in a terminal reaches the tool itself.
        start_new_session=timeout is not None,
    )
    if input is not None:
        threading.Thread(target=_type_into, args=(proc.stdin, input), daemon=True).start()
    try:
        for name, line in _output_lines(proc, deadline):
            if line is None:
                raise _timed_out(args, timeout, lines.captured)
            lines.add(name, line)
        try:
            return proc.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        except subprocess.TimeoutExpired:
            raise _timed_out(args, timeout, lines.captured) from None
    except BaseException:
        _kill(proc)
        raise


def _failure(finished, log_path, captured):
    """The error of a command that failed: a PipelineError with its one line where it refused a
    checkpoint (the user's to fix), else a ToolError with the end of its output."""
    from fairseq_entmax.repairs.checkpoint_safety import refusal_in

    refusal = refusal_in(finished.output)
    if refusal is not None:
        return PipelineError(refusal)
    where = f"; full log in {log_path}" if log_path is not None else ""
    command = finished.args
    return ToolError(
        f"{Path(command[0]).name} failed (exit {finished.returncode}){where}: {' '.join(command)}\n{_tail(captured)}"
    )


def _output_lines(proc, deadline):
    """(stream name, line) of a process's stdout and stderr as they come, until both end, or
    a last (None, None) when the deadline passes first."""
    lines = queue.Queue()
    for stream, name in ((proc.stdout, "stdout"), (proc.stderr, "stderr")):
        threading.Thread(target=_read_lines, args=(stream, name, lines), daemon=True).start()
    open_streams = 2
    while open_streams:
        try:
            name, line = lines.get(timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
        except queue.Empty:
            yield None, None
            return
        if line is None:
            open_streams -= 1
        else:
            yield name, line


def _read_lines(stream, name, lines):
    """Put each line of a stream on a queue as (name, line), then (name, None) at its end."""
    for line in stream:
        lines.put((name, line))
    stream.close()
    lines.put((name, None))


def _type_into(stdin, text):
    """Write text to a process's stdin and close it (a process that exits early is no error)."""
    try:
        stdin.write(text)
        stdin.close()
    except BrokenPipeError:
        pass


def _kill(proc):
    """Kill a process (and its group, where it has one of its own) and reap it."""
    if proc.returncode is not None:
        return
    try:
        if os.getpgid(proc.pid) == proc.pid:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
    except ProcessLookupError:
        pass
    proc.wait()


def _timed_out(args, timeout, captured):
    """The ToolError of a command stopped at its time limit."""
    return ToolError(f"{Path(args[0]).name} timed out after {timeout:.0f}s: {' '.join(args)}\n{_tail(captured)}")


def _tail(captured, lines=25, width=300):
    """The last lines of a command's stdout and of its stderr, each cut to a width."""
    parts = []
    for name, chunks in captured.items():
        last = "".join(chunks).splitlines()[-lines:]
        if last:
            parts.append(f"--- {name} (last lines) ---\n" + "\n".join(line[:width] for line in last))
    return "\n".join(parts) or "(no output)"
