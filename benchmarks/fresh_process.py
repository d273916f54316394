"""Run one measurement in a fresh Python process, so that it sees nothing that the caller or
an earlier measurement loaded, allocated or warmed up."""

import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def call_in_fresh_process(function, *args):
    """Call function(*args) in a new interpreter and return its result.

    Args: function: a module-level function (the child imports it by name); args: its arguments, picklable.
    Returns: What the function returned, unpickled.
    Raises Whatever the function raised, re-raised here with the child's traceback attached.
    """
    # Spawned, not forked: a fork would start from the caller's memory and its torch threads.
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()
