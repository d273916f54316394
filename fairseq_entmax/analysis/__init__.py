"""What the attention heads of fairseq checkpoints learned: learned alpha, density, head
diversity, positional and BPE-merging heads (the analyses of Correia et al., 2019).

`analyze(paths, data, output_dir, ...)` is the Python entry point, its options an
AnalysisOptions (or the same as keyword arguments); the console script
`fairseq-entmax-analyze` (fairseq_entmax.analysis.cli) calls it. Importing this package imports
torch but not fairseq: analyze() imports fairseq and loads the plugin when it loads the first
checkpoint, and matplotlib when it draws the figures. The metrics of
`fairseq_entmax.analysis.metrics` are plain torch.
"""

from fairseq_entmax.analysis.options import AnalysisOptions
from fairseq_entmax.analysis.pipeline import analyze

__all__ = ["AnalysisOptions", "analyze"]
