"""`python -m gateway.sim ...`: the same as `gateway sim ...`."""

from __future__ import annotations

import argparse

from gateway.sim.cli import add_sim_arguments, run_sim


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.sim", description=__doc__)
    add_sim_arguments(parser)
    return run_sim(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
