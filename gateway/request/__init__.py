"""The request's types: its context and each stage's record.

A leaf: it imports no stage. Every stage imports it; the pipeline imports the
stages; only the app imports the pipeline (`tests/test_architecture.py`).
"""
