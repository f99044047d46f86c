# Shared by every GPU script (source it first: `source "$(dirname "$0")/common.sh"`; benchmarks/README.md
# says how to run them). The set-up: stack_setup unpacks the stack's payload and puts it on
# PYTHONPATH (benchmarks/gpu/setup.sh does that alone, for a command of your own); router_setup does
# the same for the router's. Then a clock since the script started, lines stamped with it into
# $summary, the seconds left of $BUDGET, the scheduler's imports timed, and (fresh_smoke) one default
# smoke as a first start on a fresh host. Before stamp, set summary (the file stamped lines go to);
# for fresh_smoke also OUT, RUNS_DIR, PY and LOGS_TAR (the tar of every run's logs, rewritten after
# each run, so a run cut short by the device's limit loses nothing before it).
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SITE=${SITE:-/tmp/site}                # the stack's locked wheels, unpacked once a machine
ROUTER_SITE=${ROUTER_SITE:-/tmp/router-site}
ROUTER_PAYLOAD=${ROUTER_PAYLOAD:-$PWD/.gpu-router/router.tar.xz}  # router_setup's tar
ms() { echo $(( $(date +%s%N) / 1000000 )); }
T0=${T0:-$(ms)}
BUDGET=${BUDGET:-540}
secs_since() { local d=$(( $(ms) - $1 )); printf '%d.%01d' $((d / 1000)) $((d % 1000 / 100)); }
stamp() { printf '%7ss  %s\n' "$(secs_since "$T0")" "$*" | tee -a "$summary"; }
left() { echo $(( BUDGET - ($(ms) - T0) / 1000 )); }

# say TEXT: stamped when there is a summary file, else on stderr.
say() { if [ -n "${summary:-}" ]; then stamp "$*"; else echo "$*" >&2; fi; }

# unpack_payload D: the locked wheels of D/payload.tar.xz (the gpu-payload tool, benchmarks/README.md)
# into $SITE, once a machine: a later call on the same warm machine finds them there.
unpack_payload() {
  [ -f "$SITE/.unpacked" ] && return 0
  [ -f "$1/payload.tar.xz" ] || { say "no $SITE and no $1/payload.tar.xz: carry the payload to this call"; return 3; }
  mkdir -p "$SITE" && xz -d -T8 <"$1/payload.tar.xz" | tar -x -C "$SITE" && touch "$SITE/.unpacked"
}

# stack_fixups: the Nix stack's edits of locked wheels (overlays/fixups/sglang.nix: IPython's import
# and the frontend language made lazy; transformers.nix: torchao's import made lazy) made to $SITE once
# a machine, read from each fix-up's postInstall as Nix evaluates it ($1/NAME-postinstall.sh, made
# where Nix is by prepare_fixups.sh) with `dflashctl audit`'s own parser; the file as published stays
# beside each edited one as NAME.orig, and $SITE/.fixups-edited lists the edited files. No such
# script: say so, go on (that package stays as published).
stack_fixups() {
  [ -f "$SITE/.fixups-edited" ] && return 0
  local scripts
  scripts=$(ls "$1"/*-postinstall.sh 2>/dev/null)
  [ -n "$scripts" ] || { say "no $1/*-postinstall.sh: the payload's wheels are as published, not the Nix stack's (prepare_fixups.sh)"; return 0; }
  PYTHONPATH=$REPO/python ${PY:-python3} - "$SITE" $scripts <<'PYEOF' || return 3
import os, shutil, sys
from dflashctl.lock.fixup_scripts import effects
site, scripts = sys.argv[1], sys.argv[2:]
edited = []
for script in scripts:
    for r in effects(open(script).read()).replacements:
        path = f"{site}/{r.path.split('/site-packages/', 1)[1]}"
        text = open(path).read()
        if r.old not in text:
            sys.exit(f"fix-up {os.path.basename(script)}: {r.old!r} is not in {path}")
        if not os.path.exists(path + ".orig"):
            shutil.copyfile(path, path + ".orig")
            edited.append(path)
        open(path, "w").write(text.replace(r.old, r.new))
open(f"{site}/.fixups-edited", "w").write("".join(p + "\n" for p in edited))
print(f"fix-ups: {len(edited)} file(s) edited: {[p.split(site + '/', 1)[1] for p in edited]}", file=sys.stderr)
PYEOF
}

# stack_setup: the payload of $PAYLOAD_DIR (default .gpu) unpacked, $SITE on PYTHONPATH (each script
# puts this tree's python/ in front itself), no hub access, unbuffered Python.
stack_setup() {
  unpack_payload "${PAYLOAD_DIR:-$PWD/.gpu}" || return $?
  stack_fixups "${PAYLOAD_DIR:-$PWD/.gpu}" || return $?
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} ;; esac
}

# router_setup: sglang-router's package (the wheel nix/router-lock.json pins, unpacked and packed as
# $ROUTER_PAYLOAD, default .gpu-router/router.tar.xz; benchmarks/README.md) into $ROUTER_SITE, once a
# machine. It does not fit one transfer beside the stack's payload: a second call on the same machine.
router_setup() {
  [ -f "$ROUTER_SITE/.unpacked" ] && return 0
  [ -f "$ROUTER_PAYLOAD" ] || { say "no $ROUTER_SITE and no $ROUTER_PAYLOAD: carry the router's payload to this call"; return 3; }
  mkdir -p "$ROUTER_SITE" && xz -d -T4 <"$ROUTER_PAYLOAD" | tar -x -C "$ROUTER_SITE" && touch "$ROUTER_SITE/.unpacked"
}

# compile_bytecode: the payload's modules (and the interpreter's own torch) compiled once a machine,
# as a Nix build leaves them; the device image has none and SGLang's imports would compile at each
# start. BYTECODE=0 leaves the tree as found.
compile_bytecode() {
  local first s site
  first=$(find "$SITE/sglang" -name '*.pyc' 2>/dev/null | head -n 1)
  if [ "${BYTECODE:-1}" != 1 ] || [ -n "$first" ]; then
    say "byte code: left as found (SGLang's .pyc present: $([ -n "$first" ] && echo 1 || echo 0); BYTECODE=${BYTECODE:-1})"
    return 0
  fi
  s=$(ms)
  site=$(${PY:-python3} -c "import importlib.util as u, os; s = u.find_spec('torch'); print(os.path.dirname(os.path.dirname(s.origin)) if s else '')" 2>/dev/null)
  ${PY:-python3} -m compileall -q -j0 "$SITE" ${site:+"$site"} >/dev/null 2>&1
  say "byte code: compileall of $SITE ${site:+and $site }in $(secs_since "$s")s"
}

# machine_facts DIST...: a summary's head: the GPU(s), $PY's version and each distribution's, the
# CPU count.
machine_facts() {
  echo "== machine"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.free --format=csv,noheader 2>&1
  "$PY" - "$@" <<'PYEOF' 2>&1
import importlib.metadata as m, sys
print("python", sys.version.split()[0])
for d in sys.argv[1:]:
    try:
        print(d, m.version(d))
    except m.PackageNotFoundError:
        print(d, "absent")
PYEOF
  echo "CPU cores: $(nproc)"
}

# What a spawned SGLang scheduler child imports (SGLang's HTTP server and scheduler), timed:
# `$PY -c "$SCHEDULER_IMPORTS"` prints the seconds it took.
SCHEDULER_IMPORTS='import time; t = time.monotonic()
import sglang.srt.entrypoints.http_server, sglang.srt.managers.scheduler
print(f"{time.monotonic() - t:.2f}")'

# fresh_smoke LABEL [NAME=VALUE ...] [-- SMOKE ARGUMENTS]: a fresh HOME and XDG cache (every JIT
# cache empty; dflashctl names them under $XDG_CACHE_HOME/dflashctl/jit), at most 170 s or what is
# left; then what the writable JIT caches gained, the hook's lines from the servers' logs, and
# the result's start-up figures, into $summary. The JSON result is $OUT/LABEL.json.
fresh_smoke() {
  local label=$1; shift
  local dir=$RUNS_DIR/$label settings=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  rm -rf "$dir"; mkdir -p "$dir/home"
  local secs; secs=$(left); [ "$secs" -gt 170 ] && secs=170
  if [ "$secs" -lt 50 ]; then stamp "$label: skipped, ${secs}s left"; return 1; fi
  stamp "$label: start (${settings[*]}) limit ${secs}s"
  local s rc; s=$(ms)
  env -u TVM_FFI_CACHE_DIR -u FLASHINFER_WORKSPACE_BASE -u TRITON_CACHE_DIR -u TORCHINDUCTOR_CACHE_DIR \
    -u CUDA_CACHE_PATH -u CUTE_DSL_CACHE_DIR HOME="$dir/home" XDG_CACHE_HOME="$dir/home/.cache" "${settings[@]}" \
    timeout --signal=TERM --kill-after=15 "$secs" $PY -m dflashctl smoke --work-dir "$dir/work" \
    --keep-logs "$dir/logs" --json "$OUT/$label.json" "$@" >"$dir/smoke.out" 2>&1
  rc=$?
  stamp "$label: exit $rc after $(secs_since "$s")s"
  local jit=$dir/home/.cache/dflashctl/jit
  {
    grep -v '^\[smoke\]' "$dir/smoke.out" | cut -c1-400
    echo "  writable tvm-ffi cache ($jit/tvm-ffi): $(ls "$jit/tvm-ffi" 2>/dev/null | wc -l) entries: $(ls "$jit/tvm-ffi" 2>/dev/null | tr '\n' ' ')"
    echo "  flashinfer cache: $(find "$jit/flashinfer" -name '*.so' 2>/dev/null | tr '\n' ' ')"
    echo "  CuTe-DSL cache: $(du -sh "${CUTE_CACHE:-$jit/cute-dsl}" 2>/dev/null | cut -f1) $(find "${CUTE_CACHE:-$jit/cute-dsl}" -type f 2>/dev/null | wc -l) files"
    local tc=$dir/home/.cache/dflashctl/triton
    echo "  triton cache: $(find "$tc" -mindepth 1 -maxdepth 1 -type d ! -empty 2>/dev/null | wc -l) entries with files," \
      "$(find "$tc" -name '__grp__*' 2>/dev/null | wc -l) kernels, $(find "$tc" -name '*.so' 2>/dev/null | wc -l) helper modules:" \
      "$(find "$tc" -name '__grp__*' 2>/dev/null | sed 's/.*__grp__//; s/\.json$//' | sort | uniq -c | tr -s ' \n' ' ')"
    echo "  hook lines in the servers' logs:"
    cat "$dir"/logs/*.log 2>/dev/null | grep -ho '\[dflash kernels\].*' | sort | uniq -c | cut -c1-250 | sed 's/^/    /'
    echo "  flashinfer / JIT mentions:"
    cat "$dir"/logs/*.log 2>/dev/null | grep -hiE 'MissingJITCache|JIT compilation is disabled|cutlass|cute' | head -5 | cut -c1-200 | sed 's/^/    /'
  } >>"$summary"
  [ -f "$OUT/$label.json" ] && $PY - "$OUT/$label.json" "$label" >>"$summary" 2>&1 <<'PYEOF'
import json, sys
r, label = json.load(open(sys.argv[1])), sys.argv[2]
p = r.get("phases_s", {})
print(f"=== {label}: ok {r['ok']}, start to table {p.get('start to table')} s, "
      + ", ".join(f"{x['name']} ready {x['startup_s']} s" for x in r.get("runs", [])))
for x in r.get("runs", []):
    print(f"    {x['name']} start-up: {(x.get('startup') or {}).get('seconds')}")
    if x.get("lossless"):
        print(f"    {x['name']} lossless: {x['lossless']}")
pre = r.get("jit_prewarm") or {}
print(f"    prewarm: {json.dumps({k: pre.get(k) for k in ('enabled', 'ok', 'wall_s', 'imports_s', 'error', 'reason')})}")
for name, c in (r.get("jit_compiled") or {}).items():
    print(f"    compiled {name}: {c['compiled']} new, busy {c['busy_s']} s: {[m['module'] for m in c['modules'][:12]]}")
ident = r.get("identity") or {}
print(f"    identity: lock_matches {ident.get('lock_matches')}, unknown {ident.get('unknown')}")
PYEOF
  tar -C "$RUNS_DIR" -czf "$LOGS_TAR" $(cd "$RUNS_DIR" && ls -d ./*/logs ./*/smoke.out 2>/dev/null)
  return $rc
}
