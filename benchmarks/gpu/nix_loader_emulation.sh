#!/usr/bin/env bash
# Run CMD with the dynamic loader of this (non-Nix) host made as blind to the NVIDIA driver as a
# Nix-built Python's loader is: nix_loader_emulation.sh container|nixos CMD [ARGS...]
#
# A Nix-built Python runs Nix's glibc: no host ld.so.cache, no host /lib or /usr/lib, only
# LD_LIBRARY_PATH and its own RUNPATHs. Inside a private mount namespace (nothing leaks out) this
#   1. unsets LD_LIBRARY_PATH;
#   2. hides the driver's entries (libcuda*, libnvidia-*, ...) from the loader's default
#      directories (/lib, /usr/lib, /lib64, multiarch): each such directory is replaced by a view
#      of everything else in it, files as symlinks and subdirectories bind-mounted (the original
#      stays reachable under a side mount);
#   3. binds over /etc/ld.so.cache one that `ldconfig` rebuilt without the driver's directory.
# `ldconfig -p` and `ctypes.CDLL("libcuda.so.1")` then find nothing, as on NixOS or under Nix.
# Layouts: container = the driver stays where the image has it (its directory, e.g.
# /usr/local/nvidia/lib64, is found only by driver discovery's directory scan); nixos = that
# directory is bind-mounted at /run/opengl-driver/lib and the original is covered by an empty
# tmpfs. Needs root (mount); prints what it hides and why on stderr (EMULATION_QUIET=1: less).
set -euo pipefail
layout=${1:?usage: nix_loader_emulation.sh container|nixos CMD [ARGS...]}
shift
case $layout in container | nixos) ;; *) echo "unknown layout $layout" >&2; exit 2 ;; esac
say() { [[ -n ${EMULATION_QUIET:-} ]] || echo "[emulation:$layout] $*" >&2; }

if [[ -z ${DFLASH_EMULATION_INNER:-} ]]; then
  # The driver's directory, found before anything is hidden: where libcuda.so.1 really is.
  lib=$( { ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" && /x86-64|AArch64/ {print $NF; exit}'; } || true)
  IFS=: read -ra ldpath <<< "${LD_LIBRARY_PATH:-}"
  for d in "${ldpath[@]}"; do [[ -z $lib && -e $d/libcuda.so.1 ]] && lib=$d/libcuda.so.1; done
  [[ -n $lib ]] || { echo "no libcuda.so.1 on this host: nothing to emulate" >&2; exit 3; }
  export DFLASH_EMULATION_DRIVER_DIR=$(dirname "$(readlink -f "$lib")")
  exec env DFLASH_EMULATION_INNER=1 unshare -m --propagation private "$0" "$layout" "$@"
fi

driver_dir=$DFLASH_EMULATION_DRIVER_DIR
scratch=$(mktemp -d "${TMPDIR:-/tmp}/dflash-emulation.XXXXXX")  # an empty directory stays behind
mount -t tmpfs tmpfs "$scratch"
say "driver libraries really live in $driver_dir"

# 2. The loader's default directories: hide the driver's entries, keep everything else.
python3 - "$scratch" "$driver_dir" <<'PY' | while read -r dir; do
import os, re, sys
scratch, driver_dir = sys.argv[1], sys.argv[2]
driver = re.compile(r"^(libcuda|libcudadebugger|libnvcuvid|libnvoptix|libnvidia-[a-z0-9-]+)\.so")
seen = set()
for d in ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
          "/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu"):
    real = os.path.realpath(d)
    if not os.path.isdir(real) or real in seen:
        continue
    seen.add(real)
    hits = sorted(n for n in os.listdir(real) if driver.match(n))
    if not hits:
        continue
    if real == driver_dir:
        sys.exit(f"the driver lives in the default directory {real}: hiding it would hide it from discovery too")
    for n in hits:
        target = os.path.realpath(os.path.join(real, n))
        if not os.environ.get("EMULATION_QUIET"):
            print(f"[emulation] hide {os.path.join(real, n)} (-> {target}): the loader searches {real} "
                  "by default", file=sys.stderr)
    print(real)
PY
  key=${dir//\//_}
  mkdir -p "$scratch/orig/$key" "$scratch/view/$key"
  mount --bind "$dir" "$scratch/orig/$key"
  # Files become symlinks; directories are bind-mounted, so that `..` inside them still leads
  # back up this tree (gcc finds its C++ headers as /usr/lib/gcc/<triple>/<v>/../../../../include).
  python3 - "$scratch/orig/$key" "$scratch/view/$key" <<'PY' | while read -r sub; do
import os, re, sys
orig, view = sys.argv[1], sys.argv[2]
driver = re.compile(r"^(libcuda|libcudadebugger|libnvcuvid|libnvoptix|libnvidia-[a-z0-9-]+)\.so")
for n in os.listdir(orig):
    if driver.match(n):
        continue
    src = os.path.join(orig, n)
    if os.path.isdir(src) and not os.path.islink(src):
        os.mkdir(os.path.join(view, n))
        print(n)
    else:
        os.symlink(src, os.path.join(view, n))
PY
    mount --bind "$scratch/orig/$key/$sub" "$scratch/view/$key/$sub"
  done
  mount --rbind "$scratch/view/$key" "$dir"
  say "masked the driver's entries in $dir (other files still there as symlinks, directories bound)"
done

# The NixOS layout: the driver at /run/opengl-driver/lib, nowhere else.
if [[ $layout == nixos ]]; then
  mkdir -p /run/opengl-driver  # stays behind, empty (no driver in it) once the namespace is gone
  mount -t tmpfs tmpfs /run/opengl-driver
  mkdir /run/opengl-driver/lib
  mount --bind "$driver_dir" /run/opengl-driver/lib
  mount -t tmpfs tmpfs "$driver_dir"
  say "bound $driver_dir at /run/opengl-driver/lib and covered the original with an empty tmpfs"
fi

# 3. An ld.so.cache without the driver's directory (the default dirs above are already masked).
python3 - "$driver_dir" > "$scratch/ld.so.conf" <<'PY'
import glob, os, sys
driver_dir = sys.argv[1]
def lines(path):
    for raw in open(path):
        line = raw.split("#")[0].strip()
        if line.startswith("include "):
            for f in sorted(glob.glob(line.split(None, 1)[1])):
                yield from lines(f)
        elif line:
            yield line
for d in lines("/etc/ld.so.conf"):
    if os.path.realpath(d) == driver_dir:
        print(f"[emulation] ld.so.conf: dropped {d}, the driver's directory", file=sys.stderr)
    else:
        print(d)
PY
ldconfig -X -C "$scratch/ld.so.cache" -f "$scratch/ld.so.conf"
mount --bind "$scratch/ld.so.cache" /etc/ld.so.cache
say "/etc/ld.so.cache rebuilt without $driver_dir; its driver entries now: $(ldconfig -p | grep -cE 'libcuda\.so|libnvidia-ml\.so' || true)"
say "LD_LIBRARY_PATH was: ${LD_LIBRARY_PATH:-<unset>}; unset"
unset LD_LIBRARY_PATH DFLASH_EMULATION_INNER DFLASH_EMULATION_DRIVER_DIR
exec "$@"
