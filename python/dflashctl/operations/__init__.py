"""The host's operations across its instances: the router in front of them, rollouts, status, monitoring.

One instance's life (its settings, argv, unit and supervisor) is `dflashctl.service`; this package
sits above it and never the other way round. It mirrors the NixOS module's concerns
(nix/modules/). Entry points: `router.py` and `router_unit.py` (`dflashctl router`, `router-unit`; the router's
admin API in `router_admin.py`), `rollout.py` (`dflashctl rollout`: `rollout_plan.py` decides, `rollout_machine.py` runs the steps,
`canary.py` measures and judges, `rollout_state.py` remembers), `status.py` (`dflashctl status`, sampled by
`status_collect.py`; a fleet's reports in `fleet_status.py`), `upgrade.py` (`dflashctl upgrade`: one host's
step of a fleet upgrade, builds by `upgrade_build.py`) and `monitoring.py` (`dflashctl monitoring`, from
`data/monitoring/`, every file held to what Prometheus takes by `promcheck.py`; a fleet's in
`fleet_monitoring.py`). `instances.py` finds the host's instances, one way for all three.
`validate_files.py` is `dflashctl validate` (instance settings by service/validate.py, router
settings by router.py's rules).
"""
