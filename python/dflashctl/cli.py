"""The `dflashctl` command line: parses arguments, dispatches, prints errors as one paragraph.

Each subcommand lives in its own module exposing `register(subparsers)`, which adds its parser and
sets `func(args) -> int`. This file knows nothing else about them.
"""

import argparse
import importlib
import sys

from dflashctl import __version__
from dflashctl.errors import DflashError

# subcommand -> module; imported lazily so one broken module cannot break the others.
COMMANDS = {
    "lock": "dflashctl.lock.lock",
    "export": "dflashctl.lock.export",
    "audit": "dflashctl.lock.audit",
    "doctor": "dflashctl.host.doctor",
    "diff": "dflashctl.host.fingerprint_diff",
    "kernels": "dflashctl.host.kernels",
    "validate": "dflashctl.service.validate",
    "serve": "dflashctl.service.serve",
    "unit": "dflashctl.service.unit",
    "router": "dflashctl.service.router",
    "router-unit": "dflashctl.service.router_unit",
    "rollout": "dflashctl.service.rollout",
    "models": "dflashctl.service.models",
    "status": "dflashctl.service.status",
    "monitoring": "dflashctl.service.monitoring",
    "smoke": "dflashctl.smoke.smoke",
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dflashctl", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"dflashctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Register only the named subcommand when one is given: start-up stays fast for `serve`.
    wanted = [a for a in argv if a in COMMANDS][:1] or list(COMMANDS)
    for name in wanted:
        importlib.import_module(COMMANDS[name]).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except DflashError as e:
        print(f"dflashctl {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"dflashctl {args.command}: interrupted", file=sys.stderr)
        return 130
