"""smoke/options.py: the command line becomes one frozen SmokeOptions, every flag in it."""

import dataclasses

import pytest

from dflashctl import cli
from dflashctl.smoke import options


def parse(*args: str):
    argv = ["smoke", *args]
    return cli.build_parser(argv).parse_args(argv)


def test_every_flag_reaches_the_options():
    ns = vars(parse())
    fields = {f.name for f in dataclasses.fields(options.SmokeOptions)}
    renamed = {"no_grammar": "grammar", "sweep": "sweep_points"}
    missing = sorted(k for k in ns if k not in ("command", "func") and renamed.get(k, k) not in fields)
    assert not missing, f"smoke flags SmokeOptions does not carry: {missing}"
    assert options.DERIVED == set(renamed.values()) | {"runs"}


def test_defaults_and_derived_values():
    o = options.from_args(parse("--no-grammar", "--sweep", "8,1,8,4", "--gpu", "1"))
    assert (o.grammar, o.sweep_points, o.gpu, o.runs, o.synthetic_pair) == (False, (1, 4, 8), 1, "auto", "oracle")
    assert options.from_args(parse("--pair", "broken")).runs == "baseline,DFLASH"
    assert options.from_args(parse("--pair", "broken", "--runs", "DFLASH")).runs == "DFLASH"
    assert options.from_args(parse("--model", "m", "--draft-model", "d")).synthetic_pair is None


def test_the_options_are_frozen():
    o = options.from_args(parse())
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.requests = 1
