"""Sparse attention in a Hugging Face transformers model: a small Marian on the toy pair."""
