"""The directory dflashctl puts first on the SGLang child's PYTHONPATH (prebuilt kernels, or the
fast start): `sitecustomize.py` runs in every Python process SGLang starts (its scheduler runs in a
spawned child) and installs `dflash_faststart` (the server's children forked from a preloaded
template) and `dflash_kernel_hook`. These files use the standard library only: the stack's
interpreter does not have dflashctl.
"""
