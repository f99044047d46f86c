"""`dflashctl models fetch --config FILE`: each instance's models, at their pinned revisions, into
the cache the instance's SGLang reads, verified against the hub's file hashes.

Run it once per host (or image) before starting instances with `offline = true`: the service then
never reaches the hub. Downloads go through the hub client (huggingface_hub, in the locked stack),
which lays out the cache as SGLang expects and resumes interrupted files; every file is then
hashed (sha256 for LFS files, the git blob id for the rest) and a manifest of the commit is written,
which preflight checks by size in milliseconds (host/hub_cache.py).
"""

import hashlib
import json
import os
import shutil
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from dflashctl import cli_help, output
from dflashctl.errors import FAILED, OK, DflashError
from dflashctl.host import hub_cache
from dflashctl.service import config, serve, sglang_args


@dataclass(frozen=True)
class HubFile:
    path: str
    size: int
    sha256: str | None  # LFS files
    blob_id: str | None  # git object id (sha1 of "blob <size>\0<bytes>") for the rest


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:
        raise DflashError("cannot fetch models: huggingface_hub is not installed", str(e),
                          "run dflashctl from the stack's environment (nix profile install "
                          ".#dflash-env, or the venv made from `dflashctl export`)", FAILED)
    return huggingface_hub


def file_digest(path: Path, algorithm: str, size: int) -> str:
    h = hashlib.new(algorithm)
    if algorithm == "sha1":  # git's blob id
        h.update(f"blob {size}\0".encode())
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def verify(path: Path, f: HubFile) -> str | None:
    """None when the file matches the hub's listing, else what differs."""
    size = path.stat().st_size
    if size != f.size:
        return f"size {size}, the hub lists {f.size}"
    if f.sha256:
        got = file_digest(path, "sha256", size)
        return None if got == f.sha256 else f"sha256 {got}, the hub lists {f.sha256}"
    if f.blob_id:
        got = file_digest(path, "sha1", size)
        return None if got == f.blob_id else f"git blob id {got}, the hub lists {f.blob_id}"
    return None


def listing(api, repo_id: str, revision: str | None, token: str | None) -> tuple[str, list[HubFile]]:
    info = api.model_info(repo_id, revision=revision, files_metadata=True, token=token)
    files = [HubFile(s.rfilename, int(s.size or 0), s.lfs.sha256 if s.lfs else None, s.blob_id)
             for s in info.siblings or []]
    return info.sha, sorted(files, key=lambda f: f.path)


def _gib(n: int) -> str:
    if n >= 2**27:
        return f"{n / 2**30:.2f} GiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n} bytes"


def fetch_one(repo_id: str, revision: str | None, env: dict[str, str], token: str | None,
              endpoint: str | None, say) -> dict:
    hub = _hub()
    api = hub.HfApi(endpoint=endpoint)
    home, cache = hub_cache.hf_home(env), hub_cache.hub_dir(env)
    try:
        commit, files = listing(api, repo_id, revision, token)
    except Exception as e:  # the hub client's errors: HTTP, auth, not found, offline
        raise DflashError(f"cannot list {repo_id}@{revision or 'main'} on the hub", _first_line(e),
                          unreachable_fix(endpoint) if unreachable(e) else
                          "check the repo id and revision; a gated model needs hfTokenFile "
                          "(or HF_TOKEN) with access granted on the hub", FAILED)
    total = sum(f.size for f in files)
    cache.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(cache).free
    say(f"{repo_id}@{revision or 'main'} -> commit {commit}: {len(files)} files, {_gib(total)} "
        f"(free in {cache}: {_gib(free)})")
    snapshot = cache / hub_cache.repo_folder(repo_id) / "snapshots" / commit
    have = {f.path for f in files if (snapshot / f.path).exists()
            and (snapshot / f.path).stat().st_size == f.size}
    needed = sum(f.size for f in files if f.path not in have)
    if needed > free:
        raise DflashError(f"not enough disk for {repo_id}", f"{_gib(needed)} to download, "
                          f"{_gib(free)} free in {cache}", "free space or point cacheDir elsewhere", FAILED)
    fetched = sum(_fetch_file(hub, repo_id, commit, f, i, len(files), have, snapshot, cache, token, endpoint, say)
                  for i, f in enumerate(files, 1))
    if revision and revision != commit:  # SGLang resolves the branch name offline through refs/
        ref = cache / hub_cache.repo_folder(repo_id) / "refs" / revision
        ref.parent.mkdir(parents=True, exist_ok=True)
        output.write(ref, commit, "the ref")
    manifest = hub_cache.manifest_path(home, repo_id, commit)
    manifest.parent.mkdir(parents=True, exist_ok=True)
    body = {"repo": repo_id, "revision": revision, "commit": commit,
            "files": [{"path": f.path, "size": f.size, "sha256": f.sha256, "blob_id": f.blob_id}
                      for f in files]}
    output.write(manifest, json.dumps(body, indent=1), "the manifest")
    return {"repo": repo_id, "revision": revision, "commit": commit, "files": len(files),
            "bytes": total, "downloaded_bytes": fetched, "cache": str(cache)}


def _fetch_file(hub, repo_id: str, commit: str, f, i: int, n: int, have: set, snapshot: Path, cache: Path,
                token: str | None, endpoint: str | None, say) -> int:
    """One file of the listing, downloaded unless present, verified against the listing (a file that
    does not match is removed): the bytes downloaded."""
    mark = f"[{i}/{n}] {f.path} ({_gib(f.size)})"
    fetched = 0
    if f.path not in have:
        try:
            path = Path(hub.hf_hub_download(repo_id, f.path, revision=commit, cache_dir=str(cache),
                                            token=token, endpoint=endpoint))
        except Exception as e:
            raise DflashError(f"cannot download {repo_id}/{f.path}", _first_line(e),
                              (unreachable_fix(endpoint) + "; then " if unreachable(e) else "")
                              + "run the same command again: finished files are kept and a "
                              "partial one resumes", FAILED)
        fetched = f.size
    else:
        path = snapshot / f.path
    problem = verify(path, f)
    if problem:
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)  # never leave a bad blob for SGLang to load
        raise DflashError(f"{repo_id}/{f.path} at {commit} does not match the hub's listing",
                          problem + "; the file was removed",
                          "run the same command again; if it repeats, the download is being "
                          "altered on the way (proxy, disk)", FAILED)
    say(f"  {mark} {'downloaded, ' if f.path not in have else 'present, '}verified")
    return fetched


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def unreachable(e: BaseException) -> bool:
    """The hub could not be reached at all (DNS, refused, timed out), whatever client raised it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        names = {c.__name__ for c in type(e).__mro__}
        if isinstance(e, (ConnectionError, TimeoutError, socket.gaierror)) or names & {
                "ConnectionError", "ConnectError", "ConnectTimeout", "Timeout", "TimeoutException",
                "NameResolutionError", "OfflineModeIsEnabled"}:
            return True
        e = e.__cause__ or e.__context__
    return False


def unreachable_fix(endpoint: str | None) -> str:
    return (f"the hub{f' at {endpoint}' if endpoint else ''} cannot be reached from here: check the "
            "network (DNS, a proxy in HTTPS_PROXY, HF_HUB_OFFLINE unset) or --endpoint / HF_ENDPOINT")


def instances_of(path: str) -> list[config.InstanceConfig]:
    return config.load_all(path)


def register(subparsers) -> None:
    p = subparsers.add_parser("models", help="fetch each instance's models at their pinned revisions",
                              **cli_help.texts("models", __doc__))
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    f = sub.add_parser("fetch", help="download and verify into each instance's cache")
    f.add_argument("--config", required=True, metavar="FILE",
                   help='one instance\'s settings, or {"instances": {...}}')
    f.add_argument("--cache-dir", metavar="DIR",
                   help="HF_HOME to fill (default: the instance's cacheDir, else /var/cache/dflash-<name>)")
    f.add_argument("--endpoint", metavar="URL", default=os.environ.get("HF_ENDPOINT"),
                   help="hub endpoint (default: HF_ENDPOINT, else the hub client's own)")
    f.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    f.set_defaults(func=run)
    s = sub.add_parser("status", help="which commit of each instance's models the cache holds, complete or not")
    s.add_argument("--config", required=True, metavar="FILE",
                   help='one instance\'s settings, or {"instances": {...}}')
    s.add_argument("--cache-dir", metavar="DIR", help="HF_HOME to read (default: as for fetch)")
    s.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    s.set_defaults(func=status)


def status(args) -> int:
    rows = []
    for cfg in instances_of(args.config):
        env = sglang_args.cache_env(cfg, args.cache_dir)
        for role, model, rev in (("model", cfg.model, cfg.model_revision),
                                 ("draftModel", cfg.draft_model, cfg.draft_model_revision)):
            if model is not None and not hub_cache.is_local(model):
                rows.append({"instance": cfg.name, "role": role, "offline": cfg.offline,
                             **hub_cache.inspect(env, model, rev).to_json()})
    if args.json:
        output.print_json({"ok": all(r["complete"] for r in rows), "models": rows})
    for r in rows:
        state = "complete" if r["complete"] else "INCOMPLETE: " + ", ".join(r["missing"][:4])
        print(f"{r['instance']}: {r['role']} {r['repo_id']}@{r['revision'] or 'main'} -> "
              f"{r['commit'] or '-'} {state}", file=sys.stderr if args.json else sys.stdout)
    return OK if all(r["complete"] for r in rows) else FAILED


def run(args) -> int:
    say = (lambda s: print(s, file=sys.stderr, flush=True))
    results = []
    output.check_dir(args.cache_dir, "--cache-dir")
    cfgs = instances_of(args.config)
    for cfg in cfgs:  # every cache writable before the first download
        output.check_dir(hub_cache.hf_home(sglang_args.cache_env(cfg, args.cache_dir)),
                         "--cache-dir" if args.cache_dir else f"cacheDir of {cfg.name!r}")
    for cfg in cfgs:
        env = sglang_args.cache_env(cfg, args.cache_dir)
        token = serve.read_hf_token(cfg, dict(os.environ)) if cfg.hf_token_file else \
            os.environ.get("HF_TOKEN") or None
        for model, rev in ((cfg.model, cfg.model_revision), (cfg.draft_model, cfg.draft_model_revision)):
            if model is None or hub_cache.is_local(model):
                continue
            if rev is None or not hub_cache.COMMIT_RE.fullmatch(rev):
                say(f"warning: {model} is fetched at {rev or 'main'}, which moves; pin a commit")
            results.append({"instance": cfg.name, **fetch_one(model, rev, env, token, args.endpoint, say)})
    if not results:  # the goal (every model where SGLang reads it) already holds: a success
        say("nothing to fetch: every model in the settings is a local directory, which SGLang reads as it is")
    if args.json:
        output.print_json({"ok": True, "models": results})
    else:
        for r in results:
            say(f"{r['instance']}: {r['repo']} at {r['commit']} complete in {r['cache']} "
                f"({_gib(r['downloaded_bytes'])} downloaded)")
    return OK
