"""The options of an analysis, in one object checked once.

The command line (cli.py) and the Python entry point (pipeline.analyze) build an
AnalysisOptions; the runner reads it for every checkpoint. Its checks are the only ones of
these values, so a bad value is refused the same way from both.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class AnalysisOptions:
    """How checkpoints are analyzed: the same for every checkpoint of one analysis.

    Attributes:
        subset: the data subset to run over (fairseq's --gen-subset).
        user_dir: a fairseq --user-dir to import besides this plugin, which is always loaded
            (None, the default: this plugin alone; its package folder or USER_DIR: the same).
        num_sentences: analyze only the first N sentences (lines) of the subset; None: all.
        max_tokens: tokens per batch (fairseq's --max-tokens); None: no limit.
        batch_size: sentences per batch; None: limited by max_tokens only.
        sentence_id: the sentence (0-based line) whose attention maps are drawn.
        positional_threshold: heads with an average weight at least this on the previous or
            next token are listed as positional.
        bpe_threshold: heads with an average weight at least this on the other pieces of the
            current word are listed as BPE-merging.
        interrogation_threshold: heads with an average weight at least this on the question
            marks ("?" tokens) of the sentence are listed as interrogation heads.
        device: "cpu", "cuda", ...; None: the GPU when there is one.
        figures: draw the PNG figures (else analysis.json and the tables only).
        progress: show fairseq's progress bar.

    Raises:
        ValueError: on construction, for num_sentences < 1 or a threshold outside [0, 1],
            naming the command-line option.
    """

    subset: str = "valid"
    user_dir: str | None = None
    num_sentences: int | None = None
    max_tokens: int | None = 4000
    batch_size: int | None = None
    sentence_id: int | None = 0
    positional_threshold: float = 0.9
    bpe_threshold: float = 0.5
    interrogation_threshold: float = 0.5
    device: str | None = None
    figures: bool = True
    progress: bool = True

    def __post_init__(self):
        if self.num_sentences is not None and self.num_sentences < 1:
            raise ValueError("--num-sentences must be at least 1")
        for name in ("positional_threshold", "bpe_threshold", "interrogation_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be between 0 and 1")
