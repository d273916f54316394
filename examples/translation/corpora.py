"""The data-preparation half of the paper recipes (Correia et al. 2019, Table 1): downloading the
official corpora of IWSLT17 de-en, KFTT ja-en, WMT16 ro-en and WMT14 en-de and turning them into
line-aligned plain text, out_dir/{train,valid,test}.{src,tgt}, one sentence per line.

Each `prepare_*(downloads, out_dir, src, tgt)` reads the archives already in `downloads` (see
`download`) and writes out_dir; dev/test sets of IWSLT and WMT come through sacreBLEU, which
fetches the official files. `write_smoke_data` copies the smoke mode's real text instead.
"""

import re
import shutil
import tarfile
import unicodedata
import urllib.error
import urllib.request
import zipfile
from functools import cache
from pathlib import Path

from examples.pipeline.tools import PipelineError, log

# Tasks whose prepared train/valid/test text is already tokenised by the corpus' authors (KFTT's
# data/tok: Japanese segmented with KyTea, English tokenised too): the recipe must not tokenise
# it again. Such a task also writes test.orig.{src,tgt}, the untokenised test set, which is what
# sacreBLEU scores against.
PRETOKENIZED_TASKS = ("kftt",)


# --------------------------------------------------------------------------- downloading


def download(url, dest):
    """Fetch a file (skipped when it exists: put files there by hand when offline).

    Args:
        url: what to fetch.
        dest: where to write it (written under a .part name first).

    Returns:
        `dest`, a Path.

    Raises:
        PipelineError: the download failed; the message says where to put the file by hand.
    """
    dest = Path(dest)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    log(f"downloading {url}")
    partial = dest.with_suffix(dest.suffix + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as response, open(partial, "wb") as out:
            total = int(response.headers.get("Content-Length") or 0)
            done, next_report = 0, 0
            while chunk := response.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if done >= next_report:
                    log(f"  {done >> 20} MiB" + (f" of {total >> 20} MiB" if total else ""))
                    next_report = done + (50 << 20)
    except (urllib.error.URLError, OSError) as error:
        partial.unlink(missing_ok=True)
        raise PipelineError(
            f"could not download {url} ({error}). Offline? Copy that file to {dest} yourself, or give "
            "--raw-dir DIR with plain text train/valid/test.{src,tgt}."
        ) from None
    partial.rename(dest)
    return dest


def _split_lines(text):
    # Split on "\n" only: some corpora hold \r or Unicode line separators inside sentences.
    return [line.replace("\r", " ") for line in text.split("\n")[: -1 if text.endswith("\n") else None]]


def _member_lines(archive, tail):
    """Lines of the one file inside a .tgz/.tar.gz/.zip archive whose path ends with `tail`
    (a file name, or the folders above it too where the archive holds several files of that
    name, as KFTT's data/orig and data/tok do)."""
    archive = Path(archive)

    def matching(names):
        found = [n for n in names if n == tail or n.endswith("/" + tail)]
        if not found:
            raise PipelineError(f"{archive} has no file {tail}: is the download complete? Delete it and rerun.")
        if len(found) > 1:
            raise PipelineError(
                f"{archive} has several files ending in {tail} ({', '.join(found)}): "
                "the recipe cannot tell which to read"
            )
        return found[0]

    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as z:
            data = z.read(matching(z.namelist()))
    else:
        with tarfile.open(archive) as tar:
            data = tar.extractfile(matching(tar.getnames())).read()
    return _split_lines(data.decode("utf-8", errors="replace"))


def _read(path):
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        return _split_lines(f.read())


def _write(out_dir, split, lang, lines):
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with open(Path(out_dir) / f"{split}.{lang}", "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line.strip() + "\n")


def _sacrebleu_set(test_set, src, tgt, out_dir, split):
    """A dev/test set through sacrebleu, which downloads the official WMT/IWSLT files."""
    from sacrebleu.utils import get_reference_files, get_source_file

    pair = f"{src}-{tgt}"
    try:
        source = get_source_file(test_set, pair)
        reference = get_reference_files(test_set, pair)[0]
    except (Exception, SystemExit) as error:  # sacrebleu raises, or calls sys.exit, on network or checksum errors
        raise PipelineError(
            f"could not get {test_set} {pair} through sacrebleu ({error}). Offline? "
            "Give --raw-dir DIR with plain text train/valid/test.{src,tgt}."
        ) from None
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, Path(out_dir) / f"{split}.{src}")
    shutil.copyfile(reference, Path(out_dir) / f"{split}.{tgt}")


# --------------------------------------------------------------------------- IWSLT17 de-en


def iwslt_training_lines(archive, lang):
    """The sentences of WIT3's train.tags file: it interleaves talk metadata lines (<url>,
    <talkid>, <title>, ...) with them; both sides have the same metadata lines, so dropping
    them keeps the alignment.

    Args:
        archive: WIT3's de-en.tgz.
        lang: "de" or "en".

    Returns:
        The sentences, a list.
    """
    lines = _member_lines(archive, f"train.tags.de-en.{lang}")
    return [line for line in lines if not line.lstrip().startswith("<")]


def prepare_iwslt17(downloads, out_dir, src, tgt):
    """train: WIT3 2017-01-trnted de-en.tgz train.tags (metadata lines dropped); valid: dev2010;
    test: tst2015 (both through sacreBLEU, which reads the xml files of the same archive).

    Args:
        downloads: the folder of the downloaded archives.
        out_dir: where {train,valid,test}.{SRC,TGT} are written.
        src: the source language.
        tgt: the target language.
    """
    downloads = Path(downloads)
    for lang in ("de", "en"):
        _write(out_dir, "train", lang, iwslt_training_lines(downloads / "de-en.tgz", lang))
    _sacrebleu_set("iwslt17/dev2010", src, tgt, out_dir, "valid")
    _sacrebleu_set("iwslt17/tst2015", src, tgt, out_dir, "test")


# --------------------------------------------------------------------------- KFTT ja-en


def prepare_kftt(downloads, out_dir, src, tgt):
    """KFTT 1.0 (kftt-data-1.0.tar.gz), as the paper's ~300k training pairs are its cleaned,
    tokenised training set:

      out_dir/train.{ja,en}       kftt-data-1.0/data/tok/kyoto-train.cln.{ja,en}
      out_dir/valid.{ja,en}       kftt-data-1.0/data/tok/kyoto-dev.{ja,en}
      out_dir/test.{ja,en}        kftt-data-1.0/data/tok/kyoto-test.{ja,en}
      out_dir/test.orig.{ja,en}   kftt-data-1.0/data/orig/kyoto-test.{ja,en}  (untokenised: the
                                  references sacreBLEU scores against)

    The archive holds data/orig/kyoto-{train,tune,dev,test}.{ja,en} (the untokenised text) and
    data/tok/ with the same names plus kyoto-train.cln.{ja,en}; kyoto-tune is not used here.
    data/tok is already tokenised, so the recipe does not tokenise KFTT again
    (PRETOKENIZED_TASKS).

    What public material confirms about data/tok (the KFTT page itself could not be read):
    - It is tokenised and NOT lowercased: code that reads data/tok/kyoto-train.cln.en shows its
      first lines as "He revolutionized the Japanese ink painting ." and
      'He was given the posthumous name " Toyo " or " Sesshu ( 拙宗 ) . "' (punctuation split
      off, case kept, double quotes left as '"', not Moses' &quot;), and KFTT's own baseline
      script (process.sh, as copied in public repositories) lowercases data/tok/* into data/low
      before training Moses on data/low/kyoto-train.cln.
    - Japanese is word-segmented ("日本 の 水墨 画 を 一変 さ せ た 。"); that baseline script
      advises re-tokenising Japanese output "using KyTea to match the reference", i.e. the
      data/tok Japanese references are KyTea segmentations.
    Not confirmed: which tokenizer produced the English side, and the exact rule that made
    kyoto-train.cln from kyoto-train (a sentence-length limit, by the sizes ~330k of ~440k
    pairs; the limit itself is unverified).

    Args:
        downloads: the folder of the downloaded archives.
        out_dir: where {train,valid,test}.{SRC,TGT} are written.
        src: the source language.
        tgt: the target language.

    Raises:
        PipelineError: the archive's untokenised and tokenised test sets differ in length.
    """
    archive = Path(downloads) / "kftt-data-1.0.tar.gz"
    for split, name in (("train", "train.cln"), ("valid", "dev"), ("test", "test")):
        for lang in ("ja", "en"):
            _write(out_dir, split, lang, _member_lines(archive, f"data/tok/kyoto-{name}.{lang}"))
    for lang in ("ja", "en"):
        original = _member_lines(archive, f"data/orig/kyoto-test.{lang}")
        tokenised = _member_lines(archive, f"data/tok/kyoto-test.{lang}")
        if len(original) != len(tokenised):
            raise PipelineError(
                f"{archive}: data/orig/kyoto-test.{lang} has {len(original)} lines but "
                f"data/tok/kyoto-test.{lang} has {len(tokenised)}: the untokenised references "
                "would not match the test set. Delete the archive and download it again."
            )
        _write(out_dir, "test.orig", lang, original)


# --------------------------------------------------------------------------- WMT16 ro-en

# Rico Sennrich's wmt16-scripts (github.com/rsennrich/wmt16-scripts), preprocess/:
# normalise-romanian.py turns s and t with cedilla (Ş ş Ţ ţ, U+015E/F, U+0162/3) into s and t
# with comma below (Ș ș Ț ț, U+0218/9, U+021A/B); remove-diacritics.py then maps
# Ș ș Ț ț -> S s T t, Ă ă -> A a, Â â -> A a, Î î -> I i.
_CEDILLA_TO_COMMA = str.maketrans({"\u015e": "\u0218", "\u015f": "\u0219", "\u0162": "\u021a", "\u0163": "\u021b"})
_ROMANIAN_DIACRITICS = str.maketrans(
    {
        "\u0218": "S",
        "\u0219": "s",
        "\u021a": "T",
        "\u021b": "t",
        "\u0102": "A",
        "\u0103": "a",
        "\u00c2": "A",
        "\u00e2": "a",
        "\u00ce": "I",
        "\u00ee": "i",
    }
)
_SPACES = re.compile(r" {2,}")


@cache
def _punct_normalizer(lang):
    from sacremoses import MosesPunctNormalizer

    return MosesPunctNormalizer(lang=lang)


def remove_non_printing(line):
    """Moses' remove-non-printing-char.perl: every character of Unicode category C (control,
    format such as zero-width space or byte-order mark, private use, unassigned) becomes a
    space; runs of spaces are then squeezed.

    Args:
        line: a sentence.

    Returns:
        The sentence, stripped.
    """
    line = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in line)
    return _SPACES.sub(" ", line).strip()


def normalize_romanian(line):
    """The Romanian side of the usual WMT16 ro-en preparation: Moses punctuation normalisation
    (sacremoses' MosesPunctNormalizer(lang="ro"), e.g. „ ” “ -> ", – -> -), non-printing
    characters removed (Moses' remove-non-printing-char.perl, which XLM/fairseq/mBART run here;
    wmt16-scripts' sample/preprocess.sh does not), s/t-cedilla made s/t-comma
    (normalise-romanian.py), then the diacritics removed (remove-diacritics.py): ș ş -> s,
    ț ţ -> t, ă â -> a, î -> i, and the capitals likewise. Moses tokenisation comes later, in
    the recipe. Letters written as a base letter plus a combining mark are left as they are, as
    those scripts leave them.

    Args:
        line: a Romanian sentence.

    Returns:
        The normalised sentence.
    """
    line = remove_non_printing(_punct_normalizer("ro").normalize(line))
    return line.translate(_CEDILLA_TO_COMMA).translate(_ROMANIAN_DIACRITICS)


def normalize_english(line):
    """The English side of that preparation: Moses punctuation normalisation only.

    Args:
        line: an English sentence.

    Returns:
        The normalised sentence.
    """
    return _punct_normalizer("en").normalize(line)


_WMT16_NORMALIZERS = {"ro": normalize_romanian, "en": normalize_english}


def prepare_wmt16_ro_en(downloads, out_dir, src, tgt):
    """train: Europarl v8 + SETimes2 (~600k pairs); valid: newsdev2016; test: newstest2016 (both
    through sacreBLEU).

    Every split is normalised as in the WMT16 ro-en systems built with Rico Sennrich's
    wmt16-scripts (preprocess/normalise-romanian.py and remove-diacritics.py, after Moses'
    normalize-punctuation.perl): the Romanian side with `normalize_romanian` (punctuation,
    non-printing characters, cedilla -> comma, diacritics removed), the English side with
    Moses punctuation normalisation only. The test set is normalised too, so BLEU into Romanian
    is measured against a diacritic-free reference, as in those systems (and not comparable
    with scores against the official references with diacritics); BLEU into English is measured
    against the punctuation-normalised English reference (straight quotes for curly ones).

    Args:
        downloads: the folder of the downloaded archives.
        out_dir: where {train,valid,test}.{SRC,TGT} are written.
        src: the source language.
        tgt: the target language.
    """
    downloads = Path(downloads)
    for lang in ("ro", "en"):
        lines = _member_lines(downloads / "training-parallel-ep-v8.tgz", f"europarl-v8.ro-en.{lang}")
        lines += _member_lines(downloads / "en-ro.txt.zip", f"SETIMES.en-ro.{lang}")
        log(f"normalising {len(lines)} training sentences ({lang})")
        _write(out_dir, "train", lang, map(_WMT16_NORMALIZERS[lang], lines))
    _sacrebleu_set("wmt16/dev", src, tgt, out_dir, "valid")
    _sacrebleu_set("wmt16", src, tgt, out_dir, "test")
    for split in ("valid", "test"):
        for lang in ("ro", "en"):
            lines = _read(Path(out_dir) / f"{split}.{lang}")
            _write(out_dir, split, lang, map(_WMT16_NORMALIZERS[lang], lines))


# Per task, language -> the normalisation its prepare function applies (the smoke mode too).
TEXT_NORMALIZERS = {"wmt16": _WMT16_NORMALIZERS}


# --------------------------------------------------------------------------- WMT14 en-de


def prepare_wmt14_en_de(downloads, out_dir, src, tgt):
    """train: Europarl v7 + CommonCrawl + News Commentary v9 (~4.5M pairs), in that order;
    valid: newstest2013; test: newstest2014 (full), both through sacreBLEU.

    Args:
        downloads: the folder of the downloaded archives.
        out_dir: where {train,valid,test}.{SRC,TGT} are written.
        src: the source language.
        tgt: the target language.
    """
    downloads = Path(downloads)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        with open(Path(out_dir) / f"train.{lang}", "w", encoding="utf-8") as out:
            for archive, name in (
                ("training-parallel-europarl-v7.tgz", "europarl-v7.de-en"),
                ("training-parallel-commoncrawl.tgz", "commoncrawl.de-en"),
                ("training-parallel-nc-v9.tgz", "news-commentary-v9.de-en"),
            ):
                for line in _member_lines(downloads / archive, f"{name}.{lang}"):
                    out.write(line.strip() + "\n")
    _sacrebleu_set("wmt13", src, tgt, out_dir, "valid")
    _sacrebleu_set("wmt14/full", src, tgt, out_dir, "test")


# --------------------------------------------------------------------------- smoke mode


def write_smoke_data(task, shared_data, src, tgt, out_dir):
    """Copy the smoke mode's line ranges of the shared real text, normalised as the task's full
    data is.

    Args:
        task: the Task; `task.smoke.splits` maps split -> (file stem relative to shared_data,
            first line, end line), the files being f"{stem}.{lang}".
        shared_data: the folder of the shared corpora (../shared/data).
        src: the source language.
        tgt: the target language.
        out_dir: where {train,valid,test}.{SRC,TGT} are written.

    Raises:
        PipelineError: a file of the shared data is missing.
    """
    for split, (stem, start, stop) in task.smoke.splits.items():
        for lang in (src, tgt):
            path = Path(shared_data) / f"{stem}.{lang}"
            if not path.is_file():
                raise PipelineError(
                    f"smoke data {path} not found: the smoke mode reads ../shared/data (or --shared-data DIR)"
                )
            with open(path, encoding="utf-8", newline="\n") as f:
                lines = f.read().split("\n")[start:stop]
            # The smoke text goes through the task's normalisation too, as its full data does.
            normalize = TEXT_NORMALIZERS.get(task.name, {}).get(lang)
            _write(out_dir, split, lang, map(normalize, lines) if normalize else lines)
