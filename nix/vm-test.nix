# checks.nixos-vm: services.dflash on a booted NixOS machine (a QEMU VM of the NixOS test driver),
# no GPU. Two hosts: `good` runs an instance whose SGLang is the stand-in server of the tests
# (tests/data/service/standin_server.py, the Python standard library only) with the probes skipped,
# and checks start-until-ready, a restart after SGLang dies and a clean stop, with SGLang's router
# (services.dflash.router, the pinned sglang-router) in front of it; `broken` runs the real
# preflight over a stack whose Python has no torch, and checks that it fails within seconds, says why
# in the unit's status and is not restarted. Needs nixpkgs and KVM: tier 2 only (docs/nix.md).
#
# Nothing here needs the CUDA stack: no host's closure holds dflash-env, dflash-kernels or a wheel
# of nix/python-lock.json (tests/test_nix_checks.py reads each check's dependency derivations over a
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

  instance = {
    model = "stand-in";
    gpus = [ 0 ];
    port = 31000;
    startTimeoutSec = 60;
    environment = {
      STANDIN_READY_AFTER = "2";
    };
  };
  host = dflashctlPackage: package: router: {
    imports = [ self.nixosModules.dflash ];
    services.dflash = {
      inherit dflashctlPackage package;
      kernelsPackage = null; # the flake's default builds SGLang's kernels with nvcc over the stack
      instances.a = instance;
      router.enable = router;
    };
    environment.systemPackages = [ pkgs.curl ];
  };
in
pkgs.testers.runNixOSTest {
  name = "dflash-service";
  nodes.good = host dflashctlStandIn standInEnv true;
  nodes.broken = host dflashctl noStack false;
  testScript = ''
    import time
    unit = "dflash-a.service"

    def prop(machine, name):
        return machine.succeed(f"systemctl show -P {name} {unit}").strip()

    start_all()

    # Type=notify: active only once the stand-in answered /health_generate
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

    # a clean stop: SIGTERM through dflashctl, nothing left behind
    good.succeed(f"systemctl stop {unit}")
    assert prop(good, "Result") == "success", prop(good, "Result")
    good.fail("pgrep -f standin_server.py")

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
