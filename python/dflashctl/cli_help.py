"""What every subcommand's parser shares: its --help texts (description from the module's
docstring, the exit codes as an epilog) and argument types that refuse values that make no sense."""

import argparse
import textwrap

from dflashctl import exit_codes

WIDTH = 100


def description(doc: str | None, full: bool = False) -> str:
    """The module docstring's first paragraph as one wrapped paragraph (`full`: all of it, as written)."""
    text = (doc or "").strip()
    if full:
        return text
    first = " ".join(text.split("\n\n", 1)[0].split())
    return textwrap.fill(first, WIDTH)


def texts(command: str, doc: str | None, full: bool = False) -> dict:
    """add_parser keyword arguments: description (from `doc`, a docstring or a sentence), the
    exit-code epilog of `command`, a formatter keeping both as written."""
    return {"description": description(doc, full), "epilog": exit_codes.epilog(command),
            "formatter_class": argparse.RawDescriptionHelpFormatter}


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be 1 or more")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number of seconds above 0")
    return value
