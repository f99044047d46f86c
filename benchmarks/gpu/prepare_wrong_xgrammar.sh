#!/usr/bin/env bash
# Local step before benchmarks/gpu/doctor.sh: unpack the xgrammar 0.1.10 wheel (the second host's
# version in our story: it lacks StructuralTag) into .gpu/wrong-xgrammar (git-ignored, carried with
# `.gpu`). doctor.sh puts it in front of PYTHONPATH for its second run. About 0.4 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=.gpu/wrong-xgrammar
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 -d "$tmp" xgrammar==0.1.10
rm -rf "$dest" && mkdir -p "$dest"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$tmp"/xgrammar-0.1.10-*.whl "$dest"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
echo "$dest: $(du -sh "$dest" | cut -f1) (xgrammar 0.1.10, cp312)"
