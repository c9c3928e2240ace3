"""`--quick` for every script in benchmarks/: the same code on small sizes.

A benchmark nobody runs breaks without anyone noticing (issue 51: `scale.py` started
`familiar up --familiar fresh` on a root without that familiar and failed for weeks).
Each script declares its small sizes here and tests/test_benchmarks_quick.py runs every
script with `--quick`, so a script that no longer runs fails the suite. A quick run's
figures say that the code runs, nothing about speed.
"""

from __future__ import annotations

import argparse
import sys


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None, **sizes: object) -> argparse.Namespace:
    """Parse ``argv`` with a ``--quick`` flag that makes ``sizes`` the defaults (flags given still win)."""
    shown = " ".join(f"--{name.replace('_', '-')} {value}" for name, value in sizes.items())
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run on small sizes ({shown}): it shows the script runs, not how fast")
    args = parser.parse_args(argv)
    if args.quick:
        parser.set_defaults(**sizes)
        args = parser.parse_args(argv)
        print(f"quick run ({shown}): this shows the benchmark runs; its figures are not measurements",
              file=sys.stderr, flush=True)
    return args
