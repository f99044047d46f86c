# torch-c-dlpack-ext 0.1.5 ships a top-level site-packages/build_backend.py too: the same
# collision as flashinfer-python's, with the same fix.
import ./flashinfer-python.nix
