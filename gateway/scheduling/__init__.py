"""Routing: filters → weighted scorers → one picker (see `router.py`).

Kept import-free so `gateway.scheduling.config` can be imported by
`gateway.config` without cycles.
"""
