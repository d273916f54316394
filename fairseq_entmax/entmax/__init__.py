"""A drop-in for the entmax package (github deep-spin/entmax), torch only."""
