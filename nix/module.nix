# services.dflash: SGLang + DFlash instances on a NixOS host, one systemd unit each
# (dflash-<name>.service), and what serves and watches them. One module per concern, each with its
# options first, then its configuration:
#   instances.nix   the instances, the packages they run, their units and host accounts
#   validation.nix  `dflashctl validate` over them at build time (system.checks)
#   monitoring.nix  Prometheus scrape configurations, alert rules, the Grafana dashboard
#   router.nix      sglang-router in front of them (dflash-router.service)
#   rollout.nix     what a switch does with a changed instance; upgrade = "rolling" in one place
# (./modules/shared.nix is not a module: the values several of them derive from the options.)
# What decides a unit is pure functions in ./lib (service-, router-, rollout-unit.nix), which tier 1
# evaluates without nixpkgs; each returns the unit's whole systemd.services entry, and the modules
# define nothing beside it but priorities (directives at mkDefault, so a host can override any)
# and, for an instance, rollout.nix's restartIfChanged. An instance's digest covers its unit as
# NixOS writes it, restartIfChanged and what NixOS adds included (docs/nix.md, "The NixOS module").
{
  # Listed last first: NixOS merges the list definitions of a module's imports in the reverse
  # order, so assertions, system.checks and firewall ports keep the order they have always had.
  imports = [
    ./modules/rollout.nix
    ./modules/router.nix
    ./modules/monitoring.nix
    ./modules/validation.nix
    ./modules/instances.nix
  ];
}
