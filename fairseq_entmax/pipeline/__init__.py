"""The stages of a translation experiment with fairseq, shared by the quickstart, the paper
recipes and the reduced-scale reproduction, so that all of them run the same code. Each stage
is a thin layer over the tool that does the work:

- download: official corpora fetched, kept only once complete and checked
- corpus: reading and checking the line-aligned parallel text
- tokenization: Moses tokenisation and detokenisation (sacremoses)
- bpe: joint BPE (subword-nmt) and the cleaning of training pairs
- runner: an experiment as a list of steps, each a command or a Python call with its line:
  the dry run prints the lines, the run executes them and records them in commands.log
- dataset: the data stage end to end, raw text to fairseq-preprocess's binarised data, as steps
- training: the fairseq-train settings and run of one normalizer
- checkpoints: averages of a run's checkpoints
- evaluation: fairseq-generate and the scores (sacrebleu); a model's steps from training to scores
- attention_analysis: fairseq-entmax-analyze (density, learned alphas, figures)
- tables: the results table
- seeds: normalizers compared over training seeds (differences to softmax paired by seed)
- markers, tools: the `<stage>.done` markers that let a rerun skip finished stages, and
  running the tools, with the errors the scripts report (exit status 2 for a problem the user
  can fix, 1 for a failing tool)

The rest of the package knows nothing of this one: the stages reach the plugin through
fairseq's --user-dir and the fairseq-entmax-analyze command. Their tools (sacrebleu, sacremoses,
subword-nmt) are the `examples` extra, imported where a stage needs them.
"""
