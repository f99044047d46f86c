# checks.nixos-vm: services.dflash on a booted NixOS machine (a QEMU VM of the NixOS test driver),
# no GPU. Three hosts: `good` runs two instances whose SGLang is the stand-in server of the tests
# (tests/data/service/standin_server.py, the Python standard library only) with the probes skipped,
# and checks start-until-ready, a restart after SGLang dies and a clean stop, with SGLang's router
# (services.dflash.router, the pinned sglang-router) in front of them; `broken` runs the real
# preflight over a stack whose Python has no torch, and checks that it fails within seconds, says why
# in the unit's status and is not restarted. `good` (upgrade = "rolling", the default with the
# router) and `restarting` (upgrade = "restart") are switched under load to their specialisation
# `v2`, in which both instances changed: every request through the router is counted, 0 may fail
# with rolling upgrades; what restarting both at once loses is printed. `good` then switches to `v3`,
# which changes only systemd.globalEnvironment: the rollout restarts both instances onto it. Needs
# nixpkgs and KVM: tier 2 only (docs/nix.md).
#
# Nothing here needs the CUDA stack: no host's closure holds dflash-env, dflash-kernels or a wheel
# of nix/python-lock.json (tests/nix/test_nix_checks.py reads each check's dependency derivations over a
# stand-in nixpkgs). dflashctl is built from ./python as the flake builds it, but with nixpkgs'
# `packaging` instead of the locked wheel; the instances' "stack" is a Python with dflashctl alone;
# kernelsPackage is null. What a VM downloads besides NixOS itself: the router's environment
# (nix/router-lock.json, 24 wheels, ~35 MiB) and the pinned host compiler (gcc14, from the binary cache).
{ pkgs, self }:
let
  python = pkgs.python312;
  standIn = ../tests/data/service/standin_server.py;
  dflashctl = pkgs.callPackage ./packages/dflashctl.nix {
    inherit python;
    inherit (python.pkgs) packaging;
    lockFile = ./python-lock.json;
  };
  # The instances' environment: what `package` gives the unit (its bin/python), without SGLang.
  standInEnv = python.withPackages (_: [ dflashctl ]);

  # dflashctl with SGLang replaced by the stand-in and the probes skipped (they need a GPU stack).
  dflashctlStandIn = pkgs.writeShellScriptBin "dflashctl" ''
    export DFLASHCTL_SGLANG_LAUNCHER="${standInEnv}/bin/python ${standIn}"
    if [ "$1" = serve ]; then
      shift
      exec ${dflashctl}/bin/dflashctl serve --skip-preflight "$@"
    fi
    exec ${dflashctl}/bin/dflashctl "$@"
  '';
  # A "stack" whose interpreter has no torch, no SGLang: what preflight must refuse.
  noStack = pkgs.runCommand "dflash-env-without-torch" { } ''
    mkdir -p $out/bin
    ln -s ${python.interpreter} $out/bin/python
  '';

  instance = port: {
    model = "stand-in";
    gpus = [ (port - 31000) ];
    inherit port;
    startTimeoutSec = 60;
    # The stand-in serves /metrics only beside its metrics module and recording (tests/data); this
    # test checks starts, restarts and upgrades, not metrics.
    enableMetrics = false;
    environment = {
      # listening 3 s after the start, decoding 1 s later: a start the router must wait out
      STANDIN_LISTEN_AFTER = "3";
      STANDIN_READY_AFTER = "4";
    };
  };
  host = dflashctlPackage: package: router: {
    imports = [ self.nixosModules.dflash ];
    services.dflash = {
      inherit dflashctlPackage package;
      kernelsPackage = null; # the flake's default builds SGLang's kernels with nvcc over the stack
      instances.a = instance 31000;
      router.enable = router;
    };
    environment.systemPackages = [ pkgs.curl ];
  };
  # Two instances behind the router, a second configuration in which both changed, and a third
  # that differs from the second only in what NixOS itself writes into every unit.
  upgraded =
    upgrade:
    let
      v2.services.dflash.instances = {
        a.environment.STANDIN_VERSION = "2";
        b.environment.STANDIN_VERSION = "2";
      };
    in
    {
      imports = [ (host dflashctlStandIn standInEnv true) ];
      services.dflash = {
        inherit upgrade;
        instances.b = instance 31001;
      };
      specialisation.v2.configuration = v2;
      specialisation.v3.configuration = v2 // {
        systemd.globalEnvironment.DFLASH_VM_CHECK = "v3";
      };
    };
  # Closed-loop clients of the router's /generate until a stop file exists: one line per answer.
  loadClient = pkgs.writeText "dflash-load.py" ''
    import json, os, sys, threading, time, urllib.error, urllib.request
    url, out, stop = sys.argv[1], sys.argv[2], sys.argv[3]
    body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4}}).encode()
    lock, f = threading.Lock(), open(out, "a", buffering=1)
    def client():
        while not os.path.exists(stop):
            req = urllib.request.Request(url + "/generate", data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    code = r.status
            except urllib.error.HTTPError as e:
                code = e.code
            except OSError:
                code = 0
            with lock:
                f.write(json.dumps([time.time(), code]) + "\n")
    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    open(out + ".done", "w").close()
  '';
in
pkgs.testers.runNixOSTest {
  name = "dflash-service";
  nodes.good = upgraded "rolling";
  nodes.restarting = upgraded "restart";
  nodes.broken = host dflashctl noStack false;
  testScript = ''
    import json
    import time
    unit = "dflash-a.service"

    def prop(machine, name):
        return machine.succeed(f"systemctl show -P {name} {unit}").strip()

    start_all()

    # Type=notify: active only once serve saw the stand-in decode a token
    good.wait_for_unit(unit)
    good.succeed("curl -sf http://127.0.0.1:31000/health_generate")
    assert prop(good, "StatusText").startswith("ready"), prop(good, "StatusText")

    # the router (port 30080) in front of it: a /generate through it reaches the instance
    body = '{"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}'
    generate = f"curl -sf -H 'Content-Type: application/json' -d '{body}' http://127.0.0.1:30080/generate"
    good.wait_for_unit("dflash-router.service")
    assert "standin-31000" in good.wait_until_succeeds(generate, timeout=60)

    # SGLang dies: dflashctl exits non-zero and systemd starts it again
    good.succeed("pkill -9 -f standin_server.py")
    good.wait_until_succeeds(f"test $(systemctl show -P NRestarts {unit}) -ge 1", timeout=120)
    good.wait_for_unit(unit)
    good.succeed("curl -sf http://127.0.0.1:31000/health_generate")
    assert "standin-31000" in good.wait_until_succeeds(generate, timeout=60)  # re-admitted

    # nixos-rebuild switch to a configuration in which both instances changed, under load
    def upgrade_under_load(machine):
        machine.wait_for_unit("dflash-b.service")
        machine.wait_for_unit("dflash-router.service")
        machine.wait_until_succeeds(generate, timeout=60)
        ids = {u: machine.succeed(f"systemctl show -P InvocationID {u}").strip()
               for u in ("dflash-a.service", "dflash-b.service")}
        machine.succeed("systemd-run --unit=dflash-load ${python.interpreter} ${loadClient} "
                        "http://127.0.0.1:30080 /tmp/load.jsonl /tmp/load.stop")
        machine.wait_until_succeeds("test $(wc -l < /tmp/load.jsonl) -ge 50", timeout=60)
        machine.succeed("/run/booted-system/specialisation/v2/bin/switch-to-configuration test")
        for u, old in ids.items():  # both restarted into v2, and serving again
            machine.wait_until_succeeds(f"test $(systemctl show -P InvocationID {u}) != {old}", timeout=300)
            machine.wait_for_unit(u)
            machine.succeed(f"grep -q 'STANDIN_VERSION=2' /proc/$(systemctl show -P MainPID {u})/environ")
        machine.succeed("sleep 5 && touch /tmp/load.stop")
        machine.wait_until_succeeds("test -e /tmp/load.jsonl.done", timeout=120)
        codes = [json.loads(line)[1] for line in machine.succeed("cat /tmp/load.jsonl").splitlines()]
        return len(codes), sum(c != 200 for c in codes)

    total, failed = upgrade_under_load(good)
    # the rollout ran as a unit of its own, and ended well; the switch waited for it
    # (rollout.waitForVerdict: Type=oneshot), so it was over when the switch returned
    assert good.succeed("systemctl show -P Type dflash-rollout.service").strip() == "oneshot"
    assert good.succeed("systemctl show -P ActiveState dflash-rollout.service").strip() == "inactive"
    assert good.succeed("systemctl show -P Result dflash-rollout.service").strip() == "success"
    print(f"rolling upgrade under load: {total} requests, {failed} failed")
    assert failed == 0, f"{failed} of {total} requests failed during a rolling upgrade"

    # a switch that changes only what NixOS writes into every unit (systemd.globalEnvironment):
    # the instances' digests cover it, so the rollout restarts both onto it
    ids = {u: good.succeed(f"systemctl show -P InvocationID {u}").strip()
           for u in ("dflash-a.service", "dflash-b.service")}
    good.succeed("/run/booted-system/specialisation/v3/bin/switch-to-configuration test")
    for u, old in ids.items():
        good.wait_until_succeeds(f"test $(systemctl show -P InvocationID {u}) != {old}", timeout=300)
        good.wait_for_unit(u)
        good.succeed(f"grep -q 'DFLASH_VM_CHECK=v3' /proc/$(systemctl show -P MainPID {u})/environ")
    good.wait_until_succeeds("test $(systemctl show -P ActiveState dflash-rollout.service) = inactive",
                             timeout=300)
    assert good.succeed("systemctl show -P Result dflash-rollout.service").strip() == "success"
    total_r, failed_r = upgrade_under_load(restarting)
    print(f"both instances restarted at once by the switch: {total_r} requests, {failed_r} failed")

    # a clean stop: SIGTERM through dflashctl, nothing left behind
    good.succeed(f"systemctl stop {unit}")
    assert prop(good, "Result") == "success", prop(good, "Result")
    good.fail("pgrep -f 'standin_server.py.* --port 31000'")

    # no torch: the real preflight refuses in seconds, lists why with the fix, no restart
    broken.wait_until_succeeds(f"systemctl is-failed {unit}", timeout=120)
    status, code = prop(broken, "StatusText"), prop(broken, "ExecMainStatus")
    assert code in ("80", "84", "85", "86"), code  # torch, native libraries, driver, sglang
    assert status.startswith(f"failed (exit {code}): preflight: "), status
    assert "fix: " in status, status
    time.sleep(float(prop(broken, "RestartUSec").rstrip("s") or 0) + 2)
    assert prop(broken, "NRestarts") == "0", prop(broken, "NRestarts")
  '';
}
