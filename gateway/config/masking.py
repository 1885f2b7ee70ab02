"""Secrets masked out of the effective config (`gateway check-config`,
`GET /admin/config`).

Masking goes by field name, not by a list of fields: every string whose key
contains `key`, `secret`, `token`, `password` or `sha256` becomes `***`
(a new secret field is masked without anyone remembering to list it), except
the few names below that match and hold no secret. The password of every
`url` is masked too (`redis://user:***@host`).
"""

from __future__ import annotations

import re
from typing import Any

from gateway.config.state import mask_url_password

MASK = "***"
SECRET_NAME = re.compile(r"key|secret|token|password|sha256", re.IGNORECASE)
#: Names that match `SECRET_NAME` but hold no secret.
NOT_SECRET = frozenset({"key_prefix"})


def is_secret(name: str) -> bool:
    return name not in NOT_SECRET and SECRET_NAME.search(name) is not None


def mask_secrets(plain: Any) -> Any:
    """`plain` (dicts, lists, scalars) with its secret strings masked."""
    if isinstance(plain, dict):
        return {k: _masked(str(k), v) for k, v in plain.items()}
    if isinstance(plain, list):
        return [mask_secrets(v) for v in plain]
    return plain


def _masked(name: str, value: Any) -> Any:
    if is_secret(name):
        if isinstance(value, str):
            return MASK if value else value
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [MASK if v else v for v in value]
    if name == "url" and isinstance(value, str):
        return mask_url_password(value)
    return mask_secrets(value)
