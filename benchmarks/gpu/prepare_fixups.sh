#!/usr/bin/env bash
# Not a benchmark: a local step before a GPU call, run where Nix is (no nixpkgs needed). Writes the
# install scripts of the fix-ups that edit Python files of the locked wheels (overlays/fixups/
# sglang.nix and transformers.nix), as Nix evaluates them, into the payload's folder ($1, default
# .gpu), where common.sh's stack_fixups makes the same edits on the GPU machine.
set -euo pipefail
DIR=${1:-.gpu}
mkdir -p "$DIR"
python='python = { sitePackages = "lib/python3.12/site-packages"; interpreter = "python3.12"; };'
nix eval --raw --impure --expr "let lib = import ./tests/nix/stub-nixpkgs/lib.nix; in ((import ./overlays/fixups/sglang.nix {
  inherit lib; $python packages = { }; options = { sglangPatches = [ ]; sglangPatchFlags = [ ]; sglangSrc = null; }; }) { }).postInstall" \
  >"$DIR/sglang-postinstall.sh"
nix eval --raw --impure --expr "((import ./overlays/fixups/transformers.nix { $python }) { }).postInstall" \
  >"$DIR/transformers-postinstall.sh"
echo "wrote $DIR/sglang-postinstall.sh and $DIR/transformers-postinstall.sh"
