"""The directory dflashctl puts first on the SGLang child's PYTHONPATH when prebuilt kernels are
given: `sitecustomize.py` installs `dflash_kernel_hook` in every Python process SGLang starts (its
scheduler runs in a spawned child). Both files use the standard library only: the stack's
interpreter does not have dflashctl.
"""
