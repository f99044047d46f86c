"""`dflashctl validate FILE`: the configuration rules, written once.

FILE holds one instance's settings or {"instances": {"<name>": {...}, ...}} (what the NixOS module
checks at build time, so `nixos-rebuild` fails before anything is deployed). Rules within one
instance live in config.py; the rules across instances and against the installed SGLang live here.
`--models` also reads each instance's target and drafter where SGLang will load them
(service/model_check.py; the module passes it for models that are store paths); a hub model not in
the cache could not be read and fails it (exit 88) unless `--skip-unfetched`. A file of router
settings (`workers`, `/etc/dflash-router.json`) is checked by the router's rules instead.
"""

import ipaddress
import sys
from itertools import combinations

from dflashctl import cli_help, output
from dflashctl.errors import CONFIG, OK, PREFLIGHT_MODEL_MISSING, USAGE, DflashError
from dflashctl.host import hub_cache
from dflashctl.service import config, model_check, sglang_args, sglang_features, unit_text
from dflashctl.service.config import InstanceConfig

WILDCARD_HOSTS = tuple(unit_text.warning_texts()["wildcardHosts"])
PACKAGE_PREFIX = "package: "  # errors about the package's SGLang, not the settings


def warnings_for(cfg: InstanceConfig) -> list[str]:
    """Allowed but probably unwanted; the texts (and the module's NixOS warnings) are in warnings.json."""
    texts = unit_text.warning_texts()
    out = []
    if cfg.grammar_backend == "none":
        out.append(unit_text.fill(texts["grammarNone"], name=cfg.name))
    if cfg.host in WILDCARD_HOSTS and cfg.api_key_file is None:
        out.append(unit_text.fill(texts["openWithoutKey"], name=cfg.name, host=cfg.host))
    out += revision_warnings(cfg, texts)
    return out


def revision_warnings(cfg: InstanceConfig, texts: dict) -> list[str]:
    """Hub models that are not pinned to a commit: each host may load different weights."""
    out = []
    for key, model, rev in (("modelRevision", cfg.model, cfg.model_revision),
                            ("draftModelRevision", cfg.draft_model, cfg.draft_model_revision)):
        if model is None or hub_cache.is_local(model):
            continue
        if rev is None:
            out.append(unit_text.fill(texts["revisionMissing"], name=cfg.name, model=model, key=key))
        elif not hub_cache.COMMIT_RE.fullmatch(rev):
            out.append(unit_text.fill(texts["revisionMoves"], name=cfg.name, key=key, rev=rev))
    return out


def _hosts_clash(a: str, b: str) -> bool:
    if a in WILDCARD_HOSTS or b in WILDCARD_HOSTS or a == b:
        return True
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False  # two different names: cannot tell, leave it to the bind


def cross_rules(cfgs: list[InstanceConfig]) -> list[str]:
    out = []
    for a, b in combinations(cfgs, 2):
        if a.port == b.port and _hosts_clash(a.host, b.host):
            out.append(f"instances {a.name!r} and {b.name!r}: both use port {a.port}; give each "
                       "instance its own port")
        gpus_a, gpus_b = set(a.gpus), set(b.gpus)
        shared = gpus_a & gpus_b if gpus_a and gpus_b else (gpus_a or gpus_b or {"all"})
        if shared and not (a.allow_shared_gpus and b.allow_shared_gpus):
            which = ("every GPU (one of them leaves gpus empty)" if not (gpus_a and gpus_b)
                     else "GPU " + ", ".join(str(g) for g in sorted(shared)))
            out.append(f"instances {a.name!r} and {b.name!r}: both use {which}; give them disjoint "
                       "gpus, or set allowSharedGpus = true on both (and lower memFractionStatic)")
    return out


def shared_gpu_warnings(cfgs: list[InstanceConfig]) -> list[str]:
    """Instances sharing a GPU that cannot restart while the others run (SGLang 0.5.11's pool:
    free - (1 - f) x total > 0 needs f above the sum of the others' fractions). Without a
    memFractionStatic SGLang takes about 0.9 of the GPU (service/sglang_0_5_11.py), counted as such here."""
    texts = unit_text.warning_texts()
    by_gpu: dict[int, list[InstanceConfig]] = {}
    for c in cfgs:
        for g in c.gpus:
            by_gpu.setdefault(g, []).append(c)
    out, said = [], set()
    for gpu, group in sorted(by_gpu.items()):
        if len(group) < 2:
            continue
        share = {c.name: c.mem_fraction_static or 0.9 for c in group}
        for c in group:
            others = [o for o in group if o.name != c.name]
            total = sum(share[o.name] for o in others)
            if share[c.name] > total or c.name in said:
                continue
            said.add(c.name)
            out.append(unit_text.fill(
                texts["sharedGpuRestart"], name=c.name, gpu=str(gpu),
                fraction=f"memFractionStatic {c.mem_fraction_static:g}" if c.mem_fraction_static
                else "SGLang's default memFractionStatic, about 0.9",
                others=", ".join(f"'{o.name}'" for o in others), total=f"{total:g}"))
    return out


def package_rules(cfgs: list[InstanceConfig], python: str) -> list[str]:
    """Algorithms the deployed SGLang must have (DDTREE needs a patched SGLang)."""
    wanted = {c.speculative.algorithm for c in cfgs} - {None}
    if not wanted:
        return []
    found = sglang_features.probe(python)
    if not found.get("found"):
        return [f"{PACKAGE_PREFIX}{python} has no sglang, but instances use speculative decoding"]
    have = set(found.get("choices") or ())
    if not have:
        return []  # the source changed shape; preflight checks the algorithm again at start
    out = []
    for c in cfgs:
        algo = c.speculative.algorithm
        if algo is not None and algo not in have:
            hint = (" DDTREE is not in any SGLang release: build the package with the DDTree patch "
                    "(see docs/service.md)" if algo == "DDTREE" else "")
            out.append(f"instance {c.name!r}: speculative.algorithm {algo} is not offered by the "
                       f"package's SGLang (it offers {', '.join(sorted(have))}).{hint}")
    return out


def check(data, python: str | None = None) -> tuple[list[str], list[str], list[InstanceConfig]]:
    """(errors, warnings, configs) for one instance's JSON or {"instances": {...}}."""
    if isinstance(data, dict) and "instances" in data:
        if set(data) != {"instances"} or not isinstance(data["instances"], dict):
            return (['a file with "instances" must hold only {"instances": {"<name>": {...}}}'], [], [])
        items = list(data["instances"].items())
    else:
        items = [(None, data)]
    errors, cfgs = [], []
    for name, d in items:
        problems, kwargs = config.problems_of(d, name)
        label = name or (d.get("name") if isinstance(d, dict) else None) or "?"
        errors += [f"instance {label!r}: {p}" for p in problems]
        if not problems:
            cfgs.append(InstanceConfig(**kwargs))
    if not errors:
        errors += cross_rules(cfgs)
        if python is not None:
            errors += package_rules(cfgs, python)
    warnings = [w for c in cfgs for w in warnings_for(c)] + shared_gpu_warnings(cfgs)
    return errors, warnings, cfgs


def model_rules(cfgs: list[InstanceConfig], settings_path: str) -> tuple[list, list[str], list[str]]:
    """(failed checks, warnings, models not checked) of each instance's models, read from the cache
    its unit will use. A hub model not in that cache is not checked at all: named apart, so that
    `--models` never reports valid what it could not read."""
    failed, warnings, unchecked = [], [], []
    for c in cfgs:
        checks = model_check.check(c, sglang_args.cache_env(c), settings_path).checks
        fails, warns = model_check.as_lines(checks)
        failed += [(c.name, check, line) for check, line in
                   zip([k for k in checks if k.status == "fail"], fails)]
        warnings += [f"instance {c.name!r}: {w}" for k, w in zip([k for k in checks if k.status == "warn"], warns)
                     if "unchecked" not in k.details]
        unchecked += [f"instance {c.name!r}: {k.details['unchecked']} is not in its cache "
                      f"({hub_cache.hf_home(sglang_args.cache_env(c))})"
                      for k in checks if "unchecked" in k.details]
    return failed, warnings, unchecked


def register(subparsers) -> None:
    p = subparsers.add_parser("validate", help="check instance settings against every rule",
                              **cli_help.texts("validate", __doc__))
    p.add_argument("file", help='one instance\'s JSON, or {"instances": {...}}')
    p.add_argument("--python", metavar="PATH",
                   help="the stack's interpreter: also check its SGLang offers each algorithm")
    p.add_argument("--models", action="store_true",
                   help="also check each model and drafter (config, tokenizer, weights) where SGLang "
                        "will read them: a local directory or the instance's hub cache, never the hub")
    p.add_argument("--skip-unfetched", action="store_true",
                   help="with --models: a hub model not in the cache is named but not a failure (without "
                        "it, exit 88: nothing of it could be checked)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)
    return p


def fix_for(errors: list[str]) -> str:
    """The fix of a failed validation: the settings' problems, the package's, or both."""
    package = [e for e in errors if e.startswith(PACKAGE_PREFIX) or "package's SGLang" in e]
    fixes = []
    if len(package) < len(errors):
        fixes.append("correct the settings above (docs/service.md lists every option)")
    if package:
        fixes.append("pass --python the stack's interpreter, the one with SGLang (e.g. /opt/dflash/bin/python, "
                     "or the Nix package's bin/python), or follow the hint above")
    return "; ".join(fixes)


def run(args, data=None) -> int:
    """`data`: the file's JSON when the caller has read it (operations/validate_files.py, which sends
    router settings to the router's rules)."""
    data = config.read_json(args.file) if data is None else data
    errors, warnings, cfgs = check(data, args.python)
    model_failures, unchecked = [], []
    models, skip = getattr(args, "models", False), getattr(args, "skip_unfetched", False)
    if skip and not models:
        raise DflashError("--skip-unfetched without --models", "it says what --models does with a model "
                          "that is not in the cache", "add --models, or leave --skip-unfetched out", USAGE)
    if models and not errors:
        model_failures, model_warnings, unchecked = model_rules(cfgs, args.file)
        errors += [f"instance {name!r}: {line}" for name, _, line in model_failures]
        warnings += model_warnings
        if skip:
            warnings += [f"{u}: not checked (--skip-unfetched)" for u in unchecked]
    result = {"ok": not errors and (not unchecked or skip), "instances": [c.name for c in cfgs],
              "errors": errors, "warnings": warnings, **({"unchecked": unchecked} if unchecked else {})}
    for w in warnings:
        print(f"dflashctl validate: warning: {w}", file=sys.stderr)
    if model_failures:  # the settings are valid (else the models were not read): only these
        e = DflashError(f"{args.file}: the models do not fit",
                        f"{len(errors)} problem(s), before any weights load\n  - " + "\n  - ".join(errors),
                        "apply each fix above (docs/service.md, 'The model pair')",
                        model_failures[0][1].exit_code)
        e.result = result
        raise e
    if errors:
        e = DflashError(f"{args.file} is invalid", f"{len(errors)} problem(s)\n  - " + "\n  - ".join(errors),
                        fix_for(errors), CONFIG)
        e.result = result  # --json: the error object carries the problems (output.error_object)
        raise e
    if unchecked and not skip:
        e = DflashError(f"{args.file}: the models could not be checked",
                        f"{len(unchecked)} model(s) are not in the cache the instances read, so none of their "
                        "files were read (the settings are valid)\n  - " + "\n  - ".join(unchecked),
                        f"dflashctl models fetch --config {args.file}, then validate again; or pass "
                        "--skip-unfetched to accept models SGLang will download at their first start",
                        PREFLIGHT_MODEL_MISSING)
        e.result = result
        raise e
    if args.json:
        output.print_json(result)
    else:
        checked = " (models checked)" if models and not unchecked else (
            f" ({len(unchecked)} model(s) not in the cache, not checked)" if unchecked else "")
        print(f"{args.file}: {len(cfgs)} instance(s) valid{checked}: {', '.join(c.name for c in cfgs)}")
    return OK
