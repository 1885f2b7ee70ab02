"""Known, accepted differences between the simulator's llama.cpp flavour and llama-server.

Keys are the exact difference strings `test_sim_fidelity.differences` produces; values say
why the simulator does not copy that detail. Keep entries few: fix the simulator instead
whenever the gateway could observe the difference.
"""

from __future__ import annotations

ALLOWED: dict[str, str] = {}
