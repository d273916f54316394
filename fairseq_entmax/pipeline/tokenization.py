"""Moses tokenisation and detokenisation (sacremoses), with Japanese and Chinese split into
characters; the tokenisation of tokenized BLEU."""

import re
from multiprocessing import Pool
from pathlib import Path

from .corpus import read_lines

# Japanese and Chinese have no spaces between words, and Moses does not segment them: the
# recipes split these scripts into single characters and let joint BPE merge them again.
_CJK_CHARACTERS = r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff01-\uff60]"
_CJK = re.compile(f"({_CJK_CHARACTERS})")
_SPACE_BETWEEN_CJK = re.compile(f"(?<={_CJK_CHARACTERS}) (?={_CJK_CHARACTERS})")
CHARACTER_SEGMENTED_LANGS = ("ja", "zh")
# sacreBLEU's default tokenizer (13a) leaves a Japanese or Chinese sentence as one or two
# tokens, so BLEU reads about 0. "zh" is sacreBLEU's own for Chinese; "ja-mecab" would need
# sacrebleu[ja] (MeCab), so Japanese is scored over characters (the signature says tok:char).
SACREBLEU_TOKENIZER = {"ja": "char", "zh": "zh"}

_tokenizer = None


def _init_tokenizer(lang):
    global _tokenizer
    from sacremoses import MosesTokenizer

    _tokenizer = (lang, MosesTokenizer(lang=lang))


def _moses(tokenizer, lang, line, aggressive_dash_splits):
    line = line.strip()
    if lang in CHARACTER_SEGMENTED_LANGS:
        line = _CJK.sub(r" \1 ", line)
    # escape=False keeps & < > as they are (no HTML entities in the vocabulary).
    return tokenizer.tokenize(line, return_str=True, escape=False, aggressive_dash_splits=aggressive_dash_splits)


def _tokenize_line(line):
    # Aggressive dash splitting is Moses' -a, as in fairseq's prepare scripts.
    lang, tokenizer = _tokenizer
    return _moses(tokenizer, lang, line, aggressive_dash_splits=True)


def scoring_tokenize(lines, lang):
    """Moses tokenisation for tokenized BLEU: without -a, whose hyphen splitting turns every
    hyphenated word into three tokens and raises BLEU as compound splitting does.

    Args:
        lines: sentences, detokenised.
        lang: their language.

    Returns:
        The tokenised sentences, a list.
    """
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=lang)
    return [_moses(tokenizer, lang, line, aggressive_dash_splits=False) for line in lines]


def tokenize_file(in_path, out_path, lang, workers=1):
    """Moses-tokenise one file with sacremoses (aggressive dash splitting, as fairseq's
    prepare scripts; ja/zh split into characters).

    Args:
        in_path: the raw text, one sentence per line.
        out_path: where the tokenised text is written.
        lang: its language.
        workers: processes.
    """
    lines = read_lines(in_path)
    if workers > 1:
        with Pool(workers, initializer=_init_tokenizer, initargs=(lang,)) as pool:
            tokenized = pool.map(_tokenize_line, lines, chunksize=2000)
    else:
        _init_tokenizer(lang)
        tokenized = [_tokenize_line(line) for line in lines]
    Path(out_path).write_text("\n".join(tokenized) + "\n", encoding="utf-8")


def detokenize_lines(lines, lang):
    """Undo Moses tokenisation (and the character split of ja/zh) for sacreBLEU.

    Args:
        lines: tokenised sentences.
        lang: their language.

    Returns:
        The detokenised sentences, a list.
    """
    from sacremoses import MosesDetokenizer

    detokenizer = MosesDetokenizer(lang=lang)
    out = []
    for line in lines:
        text = detokenizer.detokenize(line.split())
        if lang in CHARACTER_SEGMENTED_LANGS:
            text = _SPACE_BETWEEN_CJK.sub("", text)
        out.append(text)
    return out
