"""fairseq's console scripts for the suite, started from a process that has imported fairseq.

`import fairseq` costs about 5 s of CPU on a 2-core machine (torch, and scikit-learn, which
fairseq's task registry imports at start-up), and the suite runs more than a hundred fairseq
commands. This module keeps one server per test worker that has imported fairseq and nothing
else, then forks it for each command.

Each forked command is the console script itself: its argv, folder, environment, standard
streams and exit status are the command's, and it imports everything past `import fairseq`
(fairseq_cli.train with its logging set-up, the plugin through --user-dir) as a fresh process
does. conftest.py writes a launcher named after each fairseq script into a folder of its own,
links every other script of the virtual environment beside them, and points
FAIRSEQ_ENTMAX_BIN (which examples.pipeline.tools and tests/helpers.py read) at that folder.

A launcher runs the real script in a fresh process instead when its server cannot be reached,
or when the command's PYTHON* or TORCH* variables (read as the interpreter and torch start, such
as PYTHONPATH or TORCH_LOGS) differ from the server's. FAIRSEQ_ENTMAX_FRESH_PROCESSES=1 turns
the server off for a run of the suite.

    python tests/command_server.py SOCKET   # serve until the parent process exits
"""

import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

# The console scripts routed through the server: fairseq's own. Others are linked as they are.
ROUTED = ("fairseq-",)
# Environment variables read when the interpreter and torch start: a command whose own differ
# from the server's runs fresh. Not TORCHINDUCTOR_* and TORCHDYNAMO_*: the command reads them
# when it first compiles, and a process that compiles sets TORCHINDUCTOR_CACHE_DIR for its children.
SETTINGS = ("PYTHON", "TORCH_")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

LAUNCHER = """#!{python} -S
# Runs {script} in a fork of the suite's command server (tests/command_server.py), or the
# script itself when the server cannot be reached.
import json, os, signal, socket, sys

SCRIPT = {script!r}
SETTINGS = {settings!r}


def connect():
    # A command whose interpreter or torch settings (PYTHONPATH, TORCH_LOGS, ...), read at
    # start-up, differ from the server's runs fresh.
    settings = {{k: v for k, v in os.environ.items() if k.startswith(SETTINGS) and k != "PYTHONUNBUFFERED"}}
    if settings != {server_settings!r}:
        return None
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect({socket_path!r})
    except OSError:
        return None
    return conn


conn = connect()
if conn is None:
    os.execv(SCRIPT, [SCRIPT, *sys.argv[1:]])
request = {{"script": SCRIPT, "argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ)}}
socket.send_fds(conn, [json.dumps(request).encode() + b"\\n"], [0, 1, 2])
for number in {signals!r}:
    signal.signal(number, lambda number, frame: conn.sendall(b"%d\\n" % number))
reply = b""
while not reply.endswith(b"\\n"):
    chunk = conn.recv(4096)
    if not chunk:
        sys.exit("command server: the command's process vanished")
    reply += chunk
status = json.loads(reply)
if "signal" in status:
    signal.signal(status["signal"], signal.SIG_DFL)
    os.kill(os.getpid(), status["signal"])
sys.exit(status["exit"])
"""


def _startup_settings():
    """This environment's start-up settings: the server's, which its forks inherit."""
    return {k: v for k, v in os.environ.items() if k.startswith(SETTINGS) and k != "PYTHONUNBUFFERED"}


def write_launchers(bin_dir, folder, socket_path):
    """Fill a folder with a launcher per routed script of bin_dir and a link to every other.

    Args:
        bin_dir: the virtual environment's bin folder.
        folder: the folder to fill (made if missing).
        socket_path: the server's socket. The server must be started with this environment.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for script in sorted(Path(bin_dir).absolute().iterdir()):
        target = folder / script.name
        if script.name.startswith(ROUTED):
            target.write_text(
                LAUNCHER.format(
                    python=sys.executable,
                    script=str(script),
                    socket_path=str(socket_path),
                    signals=tuple(int(number) for number in SIGNALS),
                    server_settings=_startup_settings(),
                    settings=SETTINGS,
                )
            )
            target.chmod(target.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        else:
            target.symlink_to(script)


def start(folder, timeout=120):
    """Write the launchers of this Python's scripts into folder/bin and start their server.

    Args:
        folder: an empty folder of the server's own (its socket and launchers).
        timeout: seconds to wait for the server to import fairseq and listen.

    Returns:
        (the server's Popen, the launchers' folder, whether it is listening). Until it listens,
        or when it failed, a launcher runs its script in a fresh process.
    """
    folder = Path(folder)
    socket_path = folder / "server.sock"
    write_launchers(Path(sys.executable).parent, folder / "bin", socket_path)
    server = subprocess.Popen([sys.executable, __file__, str(socket_path)])
    deadline = time.monotonic() + timeout
    while not socket_path.exists() and server.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return server, folder / "bin", socket_path.exists()


def _receive(conn):
    """The request line and the three standard streams a launcher sends."""
    message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
    while not message.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            raise ConnectionError("the launcher closed before its request was complete")
        message += chunk
    return json.loads(message), fds


def _exit_status(code):
    """The exit status Python gives a SystemExit's code."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run_script(request, fds):
    """Become the console script: its streams, folder, environment and argv, then its code.

    Never returns: the process exits as the script's interpreter would.
    """
    import atexit
    import io
    import runpy
    import threading

    os.setsid()
    for number, fd in enumerate(fds):
        os.dup2(fd, number)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for number in SIGNALS:
        signal.signal(number, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.FileIO(1, "w", closefd=False), encoding="utf-8", line_buffering=True, write_through=unbuffered
    )
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )
    # The interpreter's thread count was read from the server's environment at start-up.
    if "OMP_NUM_THREADS" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    script = request["script"]
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(script)
    interrupted = False
    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException as error:
        # As the interpreter ends on an uncaught exception: sys.excepthook (the plugin's reports
        # a refused checkpoint and exits 2), status 1, and death by SIGINT on Ctrl-C.
        interrupted = isinstance(error, KeyboardInterrupt)
        status = 1
        try:
            sys.excepthook(type(error), error, error.__traceback__)
        except SystemExit as stop:
            status = _exit_status(stop.code)
            interrupted = False
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def _serve_one(conn):
    """Run one command for one launcher: fork it, forward signals, report how it ended.

    Never returns.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    request, fds = _receive(conn)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_script(request, fds)
    for fd in fds:
        os.close(fd)
    ended = os.pidfd_open(pid)
    pending = b""
    while True:
        ready, _, _ = select.select([conn, ended], [], [])
        if ended in ready:
            break
        chunk = conn.recv(64)
        if not chunk:
            # The launcher is gone (killed on a timeout): so is its command, with its group.
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os._exit(0)
        pending += chunk
        *numbers, pending = pending.split(b"\n")
        for number in numbers:
            os.killpg(pid, int(number))
    _, wait_status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(wait_status):
        reply = {"signal": os.WTERMSIG(wait_status)}
    else:
        reply = {"exit": os.WEXITSTATUS(wait_status)}
    try:
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass
    os._exit(0)


def serve(socket_path):
    """Import fairseq, then fork for each launcher that connects, until the parent exits.

    Args:
        socket_path: the Unix socket to listen on; it is made when the server is ready.
    """
    import logging

    parent = os.getppid()
    sys.path[0] = os.path.dirname(sys.executable)
    # The scripts configure logging before they import fairseq, and a module of fairseq logs
    # at import, which would configure it first: the root logger is put back as it was.
    handlers, level = list(logging.root.handlers), logging.root.level
    import fairseq  # noqa: F401

    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    partial = f"{socket_path}.{os.getpid()}"
    listener.bind(partial)
    listener.listen(64)
    os.rename(partial, socket_path)
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 1.0)
        if not ready:
            continue
        conn, _ = listener.accept()
        if os.fork() == 0:
            listener.close()
            _serve_one(conn)
        conn.close()


if __name__ == "__main__":
    serve(sys.argv[1])
