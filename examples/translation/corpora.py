"""The data-preparation half of the paper recipes (Correia et al. 2019, Table 1, and Zhao et al.'s
IWSLT14 de-en): downloading the official corpora of IWSLT17 de-en, KFTT ja-en, WMT16 ro-en, WMT14
en-de and IWSLT14 de-en and turning them into line-aligned plain text,
out_dir/{train,valid,test}.{src,tgt}, one sentence per line.

Each `prepare_*(downloads, out_dir, src, tgt)` reads the archives already in `downloads` (see
`download`) and writes out_dir; dev/test sets of IWSLT and WMT come through sacreBLEU, which
fetches the official files. `write_smoke_data` copies the smoke mode's real text instead.
"""

import re
import shutil
import tarfile
import unicodedata
import zipfile
from functools import cache
from pathlib import Path

from fairseq_entmax.pipeline.bpe import clean_training_pair
from fairseq_entmax.pipeline.corpus import read_lines
from fairseq_entmax.pipeline.tokenization import scoring_tokenize
from fairseq_entmax.pipeline.tools import PipelineError, log

# Tasks whose prepared train/valid/test text is already tokenised by the corpus' authors (KFTT's
# data/tok: Japanese segmented with KyTea, English tokenised too): the recipe must not tokenise
# it again. Such a task also writes test.orig.{src,tgt}, the untokenised test set, which is what
# sacreBLEU scores against.
PRETOKENIZED_TASKS = ("kftt", "iwslt14")


# --------------------------------------------------------------------------- downloading


def _split_lines(text):
    # Split on "\n" only: some corpora hold \r or Unicode line separators inside sentences.
    return [line.replace("\r", " ") for line in text.split("\n")[: -1 if text.endswith("\n") else None]]


def _member_lines(archive, tail):
    """Lines of the one file inside a .tgz/.tar.gz/.zip archive whose path ends with `tail` (a file name, or the
    folders above it too where the archive holds several files of that name, as KFTT's data/orig and data/tok
    do).
    """
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
    """The sentences of WIT3's train.tags file: it interleaves talk metadata lines (<url>, <talkid>, <title>,
    ...) with them; both sides have the same metadata lines, so dropping them keeps the alignment.

    Args: archive: WIT3's de-en.tgz; lang: "de" or "en".
    Returns: The sentences, a list.
    """
    lines = _member_lines(archive, f"train.tags.de-en.{lang}")
    return [line for line in lines if not line.lstrip().startswith("<")]


def prepare_iwslt17(downloads, out_dir, src, tgt):
    """train: WIT3 2017-01-trnted de-en.tgz train.tags (metadata lines dropped); valid: dev2010; test: tst2015
    (both through sacreBLEU, which reads the xml files of the same archive).

    Args: downloads: the folder of the downloaded archives; out_dir: where {train,valid,test}.{SRC,TGT} are
    written; src: the source language; tgt: the target language.
    """
    downloads = Path(downloads)
    for lang in ("de", "en"):
        _write(out_dir, "train", lang, iwslt_training_lines(downloads / "de-en.tgz", lang))
    _sacrebleu_set("iwslt17/dev2010", src, tgt, out_dir, "valid")
    _sacrebleu_set("iwslt17/tst2015", src, tgt, out_dir, "test")


# --------------------------------------------------------------------------- KFTT ja-en


def prepare_kftt(downloads, out_dir, src, tgt):
    """KFTT 1.0 (kftt-data-1.0.tar.gz), as the paper's ~300k training pairs are its cleaned, tokenised training
    set:

      out_dir/train.{ja,en}       kftt-data-1.0/data/tok/kyoto-train.cln.{ja,en}
      out_dir/valid.{ja,en}       kftt-data-1.0/data/tok/kyoto-dev.{ja,en}
      out_dir/test.{ja,en}        kftt-data-1.0/data/tok/kyoto-test.{ja,en}
      out_dir/test.orig.{ja,en}   kftt-data-1.0/data/orig/kyoto-test.{ja,en}  (untokenised: the
                                  references sacreBLEU scores against)

    The archive holds data/orig/kyoto-{train,tune,dev,test}.{ja,en} (the untokenised text) and data/tok/ with
    the same names plus kyoto-train.cln.{ja,en}; kyoto-tune is not used here. data/tok is already tokenised,
    so the recipe does not tokenise KFTT again (PRETOKENIZED_TASKS).

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

    Args: downloads: the folder of the downloaded archives; out_dir: where {train,valid,test}.{SRC,TGT} are
    written; src: the source language; tgt: the target language.
    Raises PipelineError: the archive's untokenised and tokenised test sets differ in length.
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
    """Moses' remove-non-printing-char.perl: every character of Unicode category C (control, format such as
    zero-width space or byte-order mark, private use, unassigned) becomes a space; runs of spaces are then
    squeezed.

    Args: line: a sentence.
    Returns: The sentence, stripped.
    """
    line = "".join(" " if unicodedata.category(ch)[0] == "C" else ch for ch in line)
    return _SPACES.sub(" ", line).strip()


def normalize_romanian(line):
    """The Romanian side of the usual WMT16 ro-en preparation: Moses punctuation normalisation (sacremoses'
    MosesPunctNormalizer(lang="ro"), e.g. „ ” “ -> ", – -> -), non-printing characters removed (Moses'
    remove-non-printing-char.perl, which XLM/fairseq/mBART run here; wmt16-scripts' sample/preprocess.sh does
    not), s/t-cedilla made s/t-comma (normalise-romanian.py), then the diacritics removed
    (remove-diacritics.py): ș ş -> s, ț ţ -> t, ă â -> a, î -> i, and the capitals likewise. Moses
    tokenisation comes later, in the recipe. Letters written as a base letter plus a combining mark are left
    as they are, as those scripts leave them.

    Args: line: a Romanian sentence.
    Returns: The normalised sentence.
    """
    line = remove_non_printing(_punct_normalizer("ro").normalize(line))
    return line.translate(_CEDILLA_TO_COMMA).translate(_ROMANIAN_DIACRITICS)


def normalize_english(line):
    """The English side of that preparation: Moses punctuation normalisation only.

    Args: line: an English sentence.
    Returns: The normalised sentence.
    """
    return _punct_normalizer("en").normalize(line)


_WMT16_NORMALIZERS = {"ro": normalize_romanian, "en": normalize_english}


def prepare_wmt16_ro_en(downloads, out_dir, src, tgt):
    """train: Europarl v8 + SETimes2 (~600k pairs); valid: newsdev2016; test: newstest2016 (both through
    sacreBLEU).

    Every split is normalised as in the WMT16 ro-en systems built with Rico Sennrich's wmt16-scripts
    (preprocess/normalise-romanian.py and remove-diacritics.py, after Moses' normalize-punctuation.perl): the
    Romanian side with `normalize_romanian` (punctuation, non-printing characters, cedilla -> comma,
    diacritics removed), the English side with Moses punctuation normalisation only. The test set is
    normalised too, so BLEU into Romanian is measured against a diacritic-free reference, as in those systems
    (and not comparable with scores against the official references with diacritics); BLEU into English is
    measured against the punctuation-normalised English reference (straight quotes for curly ones).

    Args: downloads: the folder of the downloaded archives; out_dir: where {train,valid,test}.{SRC,TGT} are
    written; src: the source language; tgt: the target language.
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
    """train: Europarl v7 + CommonCrawl + News Commentary v9 (~4.5M pairs), in that order; valid: newstest2013;
    test: newstest2014 (full), both through sacreBLEU.

    Args: downloads: the folder of the downloaded archives; out_dir: where {train,valid,test}.{SRC,TGT} are
    written; src: the source language; tgt: the target language.
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


# --------------------------------------------------------------------------- IWSLT14 de-en

# fairseq's examples/translation/prepare-iwslt14.sh, which Zhao et al.'s fairseq_deen_est.sh
# prepares its data with: clean-corpus-n.perl -ratio 1.5 ... 1 175 on the tokenised training
# text, every 23rd line of it the validation set, and the test set the concatenation of these
# five dev/test sets of the archive, in this order.
IWSLT14_CLEAN = (175, 1.5)
IWSLT14_VALID_EVERY = 23
IWSLT14_TEST_SETS = (
    "IWSLT14.TED.dev2010",
    "IWSLT14.TEDX.dev2012",
    "IWSLT14.TED.tst2010",
    "IWSLT14.TED.tst2011",
    "IWSLT14.TED.tst2012",
)
_SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
_SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def iwslt14_training_lines(archive, lang):
    """The training text of the IWSLT14 archive as prepare-iwslt14.sh reads train.tags: lines holding <url>,
    <talkid> or <keywords> dropped, the <title> and <description> tags removed and their text kept as training
    sentences (both sides have the same such lines, so the alignment holds).

    Args: archive: the IWSLT14 de-en.tgz; lang: "de" or "en".
    Returns: The lines, a list.
    """
    lines = _member_lines(archive, f"train.tags.de-en.{lang}")
    kept = [line for line in lines if not any(tag in line for tag in ("<url>", "<talkid>", "<keywords>"))]
    for tag in ("<title>", "</title>", "<description>", "</description>"):
        kept = [line.replace(tag, "") for line in kept]
    return kept


def iwslt14_segments(xml_lines):
    """The sentences of an IWSLT dev/test xml file as prepare-iwslt14.sh takes them: the lines holding `<seg id`,
    without the seg tags and the spaces next to them.

    Args: xml_lines: the lines of the xml file.
    Returns: The sentences, a list.
    """
    return [_SEG_CLOSE.sub("", _SEG_OPEN.sub("", line)) for line in xml_lines if "<seg id" in line]


def write_iwslt14_corpus(train, test, out_dir, src, tgt):
    """Turn raw IWSLT text into prepare-iwslt14.sh's corpus. Training text: Moses tokenisation (tokenizer.perl
    without -a: sacremoses, no escaping), the pairs cleaned as clean-corpus-n.perl (1-175 tokens, length ratio
    1.5), lowercased, then every 23rd pair the validation set and the others the training set. Test text: ’
    made ', tokenised and lowercased. The raw test sentences are written too, as test.orig.{src,tgt}: the
    references sacreBLEU scores against.

    Args: train: {lang: raw training lines}, line-aligned; test: {lang: raw test sentences}, line-aligned;
    out_dir: where {train,valid,test,test.orig}.{SRC,TGT} are written; src: the source language; tgt: the
    target language.
    Returns: {"kept", "dropped"}: training pairs kept and dropped by the cleaning.
    Raises PipelineError: the two sides differ in length, or cleaning left no pair.
    """
    out_dir = Path(out_dir)
    for name, text in (("training", train), ("test", test)):
        if len(text[src]) != len(text[tgt]):
            raise PipelineError(
                f"IWSLT14 {name} text: {len(text[src])} {src} lines but {len(text[tgt])} {tgt} lines; "
                "the archive is damaged: delete it and download it again"
            )
    log(f"prepare: Moses-tokenising {len(train[src])} training pairs")
    clean_dir = out_dir / "clean"
    for lang in (src, tgt):
        _write(clean_dir, "train", lang, scoring_tokenize(train[lang], lang))
    kept, dropped = clean_training_pair(clean_dir, src, tgt, *IWSLT14_CLEAN)
    log(f"prepare: {kept} training pairs kept, {dropped} dropped (clean-corpus-n 1-175, ratio 1.5)")
    for lang in (src, tgt):
        lines = [line.lower() for line in read_lines(clean_dir / f"train.{lang}")]
        every = IWSLT14_VALID_EVERY
        _write(out_dir, "valid", lang, [line for i, line in enumerate(lines, 1) if i % every == 0])
        _write(out_dir, "train", lang, [line for i, line in enumerate(lines, 1) if i % every != 0])
        sentences = [line.replace("\u2019", "'") for line in test[lang]]
        _write(out_dir, "test", lang, [line.lower() for line in scoring_tokenize(sentences, lang)])
        _write(out_dir, "test.orig", lang, test[lang])
    shutil.rmtree(clean_dir)
    return {"kept": kept, "dropped": dropped}


def prepare_iwslt14(downloads, out_dir, src, tgt):
    """IWSLT14 de-en as fairseq's prepare-iwslt14.sh builds it from the IWSLT14 de-en.tgz: train and valid from
    train.tags, test = TED dev2010 + TEDX dev2012 + TED tst2010-2012 (write_iwslt14_corpus says how the text
    is processed).

    Args: downloads: the folder of the downloaded archive; out_dir: where
    {train,valid,test,test.orig}.{SRC,TGT} are written; src: the source language; tgt: the target language.
    """
    archive = Path(downloads) / "de-en.tgz"
    train = {lang: iwslt14_training_lines(archive, lang) for lang in ("de", "en")}
    test = {
        lang: [
            line
            for name in IWSLT14_TEST_SETS
            for line in iwslt14_segments(_member_lines(archive, f"{name}.de-en.{lang}.xml"))
        ]
        for lang in ("de", "en")
    }
    write_iwslt14_corpus(train, test, out_dir, src, tgt)


# --------------------------------------------------------------------------- smoke mode


def _smoke_lines(shared_data, ranges, lang):
    """The lines of one smoke split: `ranges` is (file stem relative to shared_data, first line, end line), or a
    list of them, concatenated; the files are f"{stem}.{lang}".
    """
    lines = []
    for stem, start, stop in [ranges] if isinstance(ranges, tuple) else ranges:
        path = Path(shared_data) / f"{stem}.{lang}"
        if not path.is_file():
            raise PipelineError(
                f"smoke data {path} not found: the smoke mode reads ../shared/data (or --shared-data DIR)"
            )
        with open(path, encoding="utf-8", newline="\n") as f:
            lines += f.read().split("\n")[start:stop]
    return lines


def write_smoke_data(task, shared_data, src, tgt, out_dir):
    """Copy the smoke mode's line ranges of the shared real text, normalised as the task's full data is.

    Args: task: the Task; `task.smoke.splits` maps split -> (file stem relative to shared_data, first line,
    end line), or a list of them, concatenated; the files are f"{stem}.{lang}"; shared_data: the folder of the
    shared corpora (../shared/data); src: the source language; tgt: the target language; out_dir: where
    {train,valid,test}.{SRC,TGT} are written.
    Raises PipelineError: a file of the shared data is missing.
    """
    for split, ranges in task.smoke.splits.items():
        for lang in (src, tgt):
            lines = _smoke_lines(shared_data, ranges, lang)
            # The smoke text goes through the task's normalisation too, as its full data does.
            normalize = TEXT_NORMALIZERS.get(task.name, {}).get(lang)
            _write(out_dir, split, lang, map(normalize, lines) if normalize else lines)


def write_iwslt14_smoke_data(task, shared_data, src, tgt, out_dir):
    """The IWSLT14 smoke corpus: the shared raw TED text of `task.smoke.splits` ("train" and "test") through the
    processing of the full data (write_iwslt14_corpus), so that the validation set is every 23rd cleaned
    training pair as there.

    Args: task: the Task; shared_data: the folder of the shared corpora (../shared/data); src: the source
    language; tgt: the target language; out_dir: where {train,valid,test,test.orig}.{SRC,TGT} are written.
    Raises PipelineError: a file of the shared data is missing.
    """
    text = {
        split: {
            lang: [line.strip() for line in _smoke_lines(shared_data, task.smoke.splits[split], lang)]
            for lang in (src, tgt)
        }
        for split in ("train", "test")
    }
    write_iwslt14_corpus(text["train"], text["test"], out_dir, src, tgt)
