"""`dflashctl validate FILE`: an instance's settings, or the router's, each by its own rules.

The instances' rules are service/validate.py (which owns the parser); the router's are
operations/router.py's, which service/ cannot import (the router is above it). What a file is is told
by its keys: `workers` is the router's alone and `model` (or `instances`) every instance file's, so
`validate /etc/dflash-router.json` checks router settings instead of calling each key unknown.
"""

import sys

from dflashctl import output
from dflashctl.errors import CONFIG, OK, DflashError
from dflashctl.operations import router
from dflashctl.service import config, validate


def register(subparsers) -> None:
    p = validate.register(subparsers)
    p.set_defaults(func=run)


def is_router_settings(data) -> bool:
    return isinstance(data, dict) and "workers" in data and not {"model", "instances"} & set(data)


def run(args) -> int:
    data = config.read_json(args.file)
    if not is_router_settings(data):
        return validate.run(args, data)
    if args.python or args.models or args.skip_unfetched:
        raise DflashError(f"{args.file} holds router settings", "--python, --models and --skip-unfetched "
                          "are about instances", "leave them out for the router's settings", CONFIG)
    problems, kw = router.problems_of(data)
    result = {"ok": not problems, "router": None if problems else router.RouterConfig(**kw).url,
              "errors": problems, "warnings": []}
    if problems:
        e = DflashError(f"{args.file} is invalid router settings", f"{len(problems)} problem(s)\n  - "
                        + "\n  - ".join(problems), "correct the settings above (docs/service.md, \"Router\", "
                        "lists them)", CONFIG)
        e.result = result
        raise e
    if args.json:
        output.print_json(result)
    else:
        print(f"{args.file}: router settings valid: {result['router']} in front of "
              f"{len(kw['workers'])} worker(s)", file=sys.stdout)
    return OK
