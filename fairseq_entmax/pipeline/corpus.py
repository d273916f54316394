"""The parallel corpus: line-aligned plain text, {train,valid,test}.{src,tgt}, read and
checked before any long work starts."""

from pathlib import Path

from .tools import PipelineError

SPLITS = ("train", "valid", "test")


def read_lines(path):
    """Lines of a text file split on "\n" only (str.splitlines would also split on the
    Unicode line separators some corpora hold inside sentences, breaking the alignment).

    Args:
        path: a UTF-8 text file.

    Returns:
        Its lines, without the line ends; a carriage return inside becomes a space.
    """
    with open(path, encoding="utf-8", newline="\n") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [line.replace("\r", " ") for line in lines]


def count_lines(path):
    """The number of lines of a file.

    Args:
        path: a text file.

    Returns:
        Its number of lines (a last line without a line end counts).
    """
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def count_nonblank_lines(path):
    """The number of lines of a file that hold more than white space.

    Args:
        path: a text file.

    Returns:
        That number.
    """
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


def check_parallel_corpus(files):
    """Check a parallel corpus before any long work: every file exists, source and target
    have the same number of lines, no split is empty.

    Args:
        files: {split: (source path, target path)}.

    Returns:
        {split: number of lines}.

    Raises:
        PipelineError: a file is missing, a split's two sides differ in length, or a side is
            empty; the message says what to fix.
    """
    missing = [str(p) for pair in files.values() for p in pair if not Path(p).is_file()]
    if missing:
        raise PipelineError(
            "missing data files:\n  "
            + "\n  ".join(missing)
            + "\nEach split needs a source and a target file, plain text, one sentence per line, "
            "line i of the target translating line i of the source."
        )
    counts = {}
    for split, (source, target) in files.items():
        n_source, n_target = count_lines(source), count_lines(target)
        if n_source != n_target:
            raise PipelineError(
                f"{split}: {source} has {n_source} lines but {target} has {n_target}. Source and target "
                "must be line-aligned (line i of one translates line i of the other): re-extract or "
                "re-align the two files."
            )
        if count_nonblank_lines(source) == 0 or count_nonblank_lines(target) == 0:
            raise PipelineError(f"{split}: {source} or {target} has no text: the corpus is empty.")
        counts[split] = n_source
    return counts


def write_first_lines(files, limits, into):
    """A smaller corpus: the first lines of each split's files, written into a folder under the same names. A
    file that already holds the same text is left alone, so that a rerun keeps what was made from it.

    Args:
        files: {split: (source file, target file)}.
        limits: {split: the lines kept}; a split not there, or None, is kept whole.
        into: the folder.
    """
    Path(into).mkdir(parents=True, exist_ok=True)
    for split, pair in files.items():
        for path in pair:
            text = "".join(line + "\n" for line in read_lines(path)[: limits.get(split)])
            target = Path(into) / Path(path).name
            if not target.exists() or target.read_text(encoding="utf-8") != text:
                target.write_text(text, encoding="utf-8")
