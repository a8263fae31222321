"""Seed 003's three-step pipeline as a durable workflow: download -> embed -> index.

Small local documents (``data/``), a deterministic stand-in for the embedding model (a hashed
bag of words), and an index table written in the index step's checkpoint transaction. Nothing is
downloaded at run time. ``python -m examples.pipeline --help``.
"""
