"""fairseq-entmax: sparse attention for fairseq's Transformer.

`fairseq_entmax.normalizers` needs only torch. Importing the package with fairseq installed
(as `fairseq-train --user-dir fairseq_entmax` does) also registers the models.
"""
from fairseq_entmax import normalizers  # noqa: F401
