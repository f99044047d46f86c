"""A stub sglang package for tests/nix/test_sglang_tree.py: what matters is how it is built."""

from sglang.version import __version__
