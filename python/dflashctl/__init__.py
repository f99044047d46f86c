"""dflashctl: one pinned SGLang + DFlash stack on every host, a service that fails fast, a smoke test."""

__version__ = "0.1.0"
