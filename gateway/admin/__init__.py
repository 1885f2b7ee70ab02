"""The admin listener (separate port, loopback by default): metrics, replica
state, drain, policy reload, the effective config and the session table.
See `app.py` for the routes and `auth.py` for the admin token."""

from __future__ import annotations

from gateway.admin.app import build_admin_app

__all__ = ["build_admin_app"]
