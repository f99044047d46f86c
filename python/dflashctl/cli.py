"""The `dflashctl` command line: parses arguments, dispatches, prints errors as one paragraph.

Each subcommand lives in its own module exposing `register(subparsers)`, which adds its parser and
sets `func(args) -> int`. This file knows nothing else about them. The contract every command
keeps (docs/cli.md; tests/cli/test_cli_contract.py runs each on a corpus of bad input): an exit code
from its row in exit_codes.py, no traceback, the last lines of stderr saying what failed and the
fix, no file written unless all of it is (output.py), and with `--json` one JSON object on stdout,
an error object when it fails.
"""

import argparse
import importlib
import sys

from dflashctl import __version__, output
from dflashctl.errors import INTERRUPTED, USAGE, DflashError

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
    "router": "dflashctl.operations.router",
    "router-unit": "dflashctl.operations.router_unit",
    "rollout": "dflashctl.operations.rollout",
    "upgrade": "dflashctl.operations.upgrade",
    "models": "dflashctl.service.models",
    "status": "dflashctl.operations.status",
    "monitoring": "dflashctl.operations.monitoring",
    "smoke": "dflashctl.smoke.smoke",
}

DESCRIPTION = ("One pinned SGLang + DFlash stack on every GPU host: lock it, check a host against it, "
               "run it as a systemd service that refuses a broken host in seconds, and prove with a "
               "smoke test that it decodes with DFlash.")
EPILOG = ("`dflashctl COMMAND --help` lists a command's options and exit codes; docs/cli.md has the "
          "contract every command keeps (exit codes, --json, output files).")


class UsageError(Exception):
    """argparse's refusal, raised instead of exiting so that main() reports it like any error."""

    def __init__(self, prog: str, message: str):
        super().__init__(message)
        self.prog, self.message = prog, message


class Parser(argparse.ArgumentParser):
    """argparse that raises UsageError (exit 2) with the command's name, not a usage dump."""

    def error(self, message: str):
        raise UsageError(self.prog, message)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = Parser(prog="dflashctl", description=DESCRIPTION, epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"dflashctl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    # Register only the named subcommand when one is given: start-up stays fast for `serve`.
    wanted = [a for a in argv if a in COMMANDS][:1] or list(COMMANDS)
    for name in wanted:
        importlib.import_module(COMMANDS[name]).register(sub)
    return parser


def _wants_json(args) -> bool:
    """--json given as a flag (smoke's --json FILE|- writes its own result, error included)."""
    return getattr(args, "json", None) is True


def _fail(who: str, e: DflashError, args) -> int:
    print(f"{who}: {e}", file=sys.stderr)
    if args is not None and _wants_json(args) and not output.json_printed():
        try:
            output.print_json(output.error_object(e))
        except DflashError:
            pass  # stdout itself is gone; stderr has said it
    return e.exit_code


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    output.reset()
    command = next((a for a in argv if a in COMMANDS), None)
    who = f"dflashctl {command}" if command else "dflashctl"
    args = None
    try:
        args = build_parser(argv).parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as u:
        e = DflashError(u.message, "", f"see `{u.prog} --help`", USAGE)
        if "--json" in argv and command != "smoke":  # did not parse, but a machine asked for JSON
            args = argparse.Namespace(json=True)
        return _fail(u.prog, e, args)
    except DflashError as e:
        return _fail(who, e, args)
    except KeyboardInterrupt:
        print(f"{who}: interrupted", file=sys.stderr)
        return INTERRUPTED
