"""Routing: filters → weighted scorers → one picker (see `router.py` and README.md).

The configuration it runs is plain data in `gateway.config.scheduling`;
`validate.py` checks its plugin specs against the registry.
"""
