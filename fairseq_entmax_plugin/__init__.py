"""fairseq_entmax.USER_DIR: the folder fairseq's --user-dir loads to load the fairseq-entmax
plugin (fairseq_entmax.plugin). A package of its own, beside fairseq_entmax, so that fairseq
imports it even in a process that imported fairseq_entmax before."""

from fairseq_entmax import plugin  # noqa: F401
