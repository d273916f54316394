"""Downloads of corpora: written under a temporary name and kept only once complete and checked,
so that a folder never holds a partial file that a rerun would take for a finished one."""

import gzip
import hashlib
import urllib.request
from pathlib import Path

from .tools import PipelineError, log

PROGRESS_EVERY = 50 << 20  # bytes between two progress lines of a large download


def download(url, dest, instead, sha256=None, gunzip=False):
    """Fetch url into dest, skipped when dest exists (put it there by hand when offline).

    Args: url: what to fetch (https://, file://); dest: where it goes; instead: what the user can do instead,
    for the error message; sha256: the digest the written file must have, or None; gunzip: whether to
    decompress the download (the digest is then that of the decompressed text).
    Returns: dest, a Path.
    Raises PipelineError: the download failed (offline, not found, not gzip) or its digest differs; the
    message names the file and the URL, and says `instead`.
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".part")
    log(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0)
            stream = gzip.GzipFile(fileobj=response) if gunzip else response
            with open(partial, "wb") as out:
                done, next_report = 0, 0
                while chunk := stream.read(1 << 20):
                    out.write(chunk)
                    done += len(chunk)
                    if done >= next_report:
                        log(f"  {done >> 20} MiB" + (f" of {total >> 20} MiB" if total and not gunzip else ""))
                        next_report = done + PROGRESS_EVERY
        if sha256 is not None:
            with open(partial, "rb") as written:
                digest = hashlib.file_digest(written, "sha256").hexdigest()
            if digest != sha256:
                raise PipelineError(
                    f"{dest.name} from {url} has sha256 {digest}, not the recorded {sha256}: not the official "
                    f"text; {instead}"
                )
        partial.replace(dest)
    except (OSError, EOFError, ValueError) as error:
        # urllib's URLError and gzip's BadGzipFile are OSErrors.
        raise PipelineError(f"cannot download {dest.name} from {url} ({error}); {instead}") from None
    finally:
        partial.unlink(missing_ok=True)
    return dest
