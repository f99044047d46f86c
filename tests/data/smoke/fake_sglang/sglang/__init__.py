"""Stand-in for SGLang in dflashctl's smoke tests: same module names, replays recorded responses."""
__version__ = "0.0.0-replay"
