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
import signal
import sys
import threading

from dflashctl import __version__, output
from dflashctl.errors import INTERRUPTED, USAGE, DflashError, Terminated

# subcommand -> module; imported lazily so one broken module cannot break the others.
COMMANDS = {
    "lock": "dflashctl.lock.lock",
    "export": "dflashctl.lock.export",
    "audit": "dflashctl.lock.audit",
    "doctor": "dflashctl.host.doctor",
    "diff": "dflashctl.host.fingerprint_diff",
    "kernels": "dflashctl.host.kernels",
    "validate": "dflashctl.operations.validate_files",
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


# SIGTERM keeps its default for: a unit's main process without --json (serve, which stops SGLang on
# its own handler, and router); upgrade, whose `rollout` child must finish its step (subprocess.run
# would SIGKILL it on the way out; upgrade does not forward the signal yet).
SIGTERM_AS_IS = {"serve", "router", "upgrade"}


def _raise_terminated(signum, frame):
    raise Terminated()


def interruption(command: str | None, signal_name: str) -> DflashError:
    again = f"dflashctl {command}" if command else "the command"
    return DflashError("interrupted", f"by {signal_name} before it finished",
                       f"run `{again}` again when wanted: what it writes is written whole or not at all, "
                       "so nothing half-done was left", INTERRUPTED)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    output.reset()
    command = next((a for a in argv if a in COMMANDS), None)
    who = f"dflashctl {command}" if command else "dflashctl"
    args = None
    # Only where nobody chose otherwise (rollout and smoke set their own handlers inside), only in
    # the main thread (the one Python runs handlers in), not for SIGTERM_AS_IS (systemd counts death
    # by SIGTERM as a clean stop, an exit 130 as a failed unit).
    own_sigterm = (command not in SIGTERM_AS_IS and threading.current_thread() is threading.main_thread()
                   and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
    held = {}
    if own_sigterm:
        signal.signal(signal.SIGTERM, _raise_terminated)
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
    except (KeyboardInterrupt, Terminated) as stop:
        if own_sigterm:  # a second Ctrl-C must not cut the report short with a traceback
            held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        name = "SIGTERM" if isinstance(stop, Terminated) else "SIGINT (Ctrl-C)"
        if args is None and "--json" in argv and command != "smoke":  # stopped while it started up
            args = argparse.Namespace(json=True)
        return _fail(who, interruption(command, name), args)
    finally:
        for s, handler in held.items():
            signal.signal(s, handler)
        if own_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
