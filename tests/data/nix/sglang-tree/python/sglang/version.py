try:
    from sglang._version import __version__  # written by setuptools-scm at build time
except ImportError:
    __version__ = "0.0.0.dev0"
