# nix/lib/license.nix: SPDX expressions from the lock -> licence ids, unfree or not (the same
# cases as tests/lock/test_lock.py's test_unfree_rule_matches_nix), and the refusal message.
let
  inherit (import ../../nix/lib) license;
  expressions = [
    "MIT"
    "Apache-2.0 OR BSD-2-Clause"
    "MPL-2.0 AND (Apache-2.0 OR MIT)"
    "Apache-2.0 WITH LLVM-exception"
    "LicenseRef-NVIDIA-Proprietary"
    "LicenseRef-NVIDIA-SOFTWARE-LICENSE"
    "MIT OR LicenseRef-Proprietary"
    "LicenseRef-Unknown"
    "LicenseRef-BSD"
  ];
in
{
  cases = map (e: {
    expression = e;
    ids = license.ids e;
    kinds = map license.kind (license.ids e);
    unfree = license.isUnfree e;
  }) expressions;
  refusal = license.refusal [
    "nvidia-cublas"
    "nvidia-cudnn-cu13"
  ];
}
