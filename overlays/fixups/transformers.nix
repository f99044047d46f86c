# transformers 5.6.0's torchao quantizer (quantizers/quantizer_torchao.py) imports torchao's
# safetensors support at module level whenever torchao is installed, and the lock installs it (SGLang
# needs it for --torchao-config). quantizers/auto.py imports that quantizer, modeling_utils imports
# quantizers, and SGLang's server imports modeling_utils: every server process paid for torchao
# (about 220 modules, ~0.26 s of a 4.9 s `import sglang.launch_server` on the 2-core development
# machine; docs/benchmarks.md, "the first import") though only a torchao-quantized checkpoint saved
# through transformers uses it. The import moves into the one method that calls it, which behaves
# as before. `dflashctl audit` checks both texts against the locked wheel.
{ python, ... }:
prev: {
  postInstall = (prev.postInstall or "") + ''
    substituteInPlace $out/${python.sitePackages}/transformers/quantizers/quantizer_torchao.py --replace-fail '
    if is_torchao_available():
        from torchao.prototype.safetensors.safetensors_support import (
            flatten_tensor_state_dict,
        )
    ' '
    ' --replace-fail '
            return flatten_tensor_state_dict(model.state_dict())
    ' '
            # dflash fix-up: imported where it is used
            from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

            return flatten_tensor_state_dict(model.state_dict())
    '
    # Byte code compiled before this edit would be stale; rebuild it from the edited file.
    pushd $out/${python.sitePackages} >/dev/null
    ${python.interpreter} -m compileall -q -f --invalidation-mode checked-hash transformers/quantizers/quantizer_torchao.py >/dev/null
    popd >/dev/null
  '';
}
