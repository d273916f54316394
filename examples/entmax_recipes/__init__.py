"""Shared stages of the quickstart, the paper recipes and the reduced-scale reproduction.

Every script under examples/ puts examples/ on sys.path and imports from here, so the four
paper recipes, the quickstart and the reproduction run the same code:
corpus checks, Moses tokenisation (sacremoses), joint BPE (subword-nmt), fairseq-preprocess,
fairseq-train, checkpoint averaging, fairseq-generate, scoring (sacrebleu), the attention
analysis (fairseq-entmax-analyze) and the results table.
"""
