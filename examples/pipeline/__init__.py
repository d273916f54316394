"""The stages of a translation experiment with fairseq, shared by the quickstart, the paper
recipes and the reduced-scale reproduction, so that all of them run the same code. Each stage
is a thin layer over the tool that does the work:

- corpus: reading and checking the line-aligned parallel text
- tokenization: Moses tokenisation and detokenisation (sacremoses)
- bpe: joint BPE (subword-nmt) and the cleaning of training pairs
- dataset: the data stage end to end, raw text to fairseq-preprocess's binarised data
- training: the fairseq-train settings and run of one normalizer
- checkpoints: the checkpoint to evaluate (last, best, or an average of the last n)
- evaluation: fairseq-generate on the test set and its scores (sacrebleu)
- attention_analysis: fairseq-entmax-analyze (density, learned alphas, figures)
- tables: the results table
- markers, tools: the `<stage>.done` markers that let a rerun skip finished stages, and
  running the tools, with the errors the scripts report (exit status 2 for a problem the user
  can fix, 1 for a failing tool)

The library (fairseq_entmax) knows nothing of this package: the stages reach it through
fairseq's --user-dir and the fairseq-entmax-analyze command, and import it only for the
--user-dir path and the safe checkpoint loader.

The scripts run as modules from the repository root (`python -m examples.quickstart.quickstart`),
and the tests import `examples.pipeline...` with the root on pytest's pythonpath.
"""
