# `dflash-kernels`: SGLang's JIT kernels (tvm-ffi modules), flashinfer's RMSNorm and Triton's
# recorded kernels compiled at build time, without a GPU, by `dflashctl kernels build` with the
# stack's own nvcc wheels and the pinned host compiler, for `cudaArchs` and the shapes of
# `modelConfigs` (plus the smoke's targets, whose Triton kernels dflashctl ships recorded for sm90
# and carries to the other archs where their specialisation allows).
# Triton's kernels of other models come from `tritonRecords`: files a GPU host wrote with
# DFLASH_TRITON_RECORD=FILE. The result is a read-only directory that services, the smoke app and the dev shell get as
# DFLASH_PREBUILT_KERNELS; a kernel it lacks (another arch, another shape, a patched SGLang) is
# compiled at the first start into the instance's writable cache, never into the store.
# All logic is in python/dflashctl/host/kernels.py; this file only names the inputs.
{
  lib,
  runCommand,
  dflash-env,
  dflashHostCompiler,
  # sm90: H100/H200; sm100: B200; sm120: RTX PRO 6000 Blackwell (the fleet's hosts)
  cudaArchs ? [
    "sm90"
    "sm100"
    "sm120"
  ],
  # config.json files or model directories (store paths) whose shapes to build
  modelConfigs ? [ ],
  withSmokeShapes ? true,
  # Triton kernels recorded on a GPU host (DFLASH_TRITON_RECORD=FILE), one file per path
  tritonRecords ? [ ],
  flashinferNorm ? true,
}:
runCommand "dflash-kernels"
  {
    nativeBuildInputs = [ dflashHostCompiler ];
    passthru = { inherit cudaArchs modelConfigs; };
    meta.description = "SGLang's JIT kernels for ${lib.concatStringsSep ", " cudaArchs}, built without a GPU";
  }
  ''
    export HOME=$TMPDIR CC=gcc CXX=g++
    ${dflash-env}/bin/dflashctl kernels build --out $out --python ${dflash-env}/bin/python \
      ${lib.concatMapStringsSep " " (a: "--arch ${lib.escapeShellArg a}") cudaArchs} \
      ${lib.concatMapStringsSep " " (m: "--model-config ${m}") modelConfigs} \
      ${lib.concatMapStringsSep " " (r: "--triton-record ${r}") tritonRecords} \
      ${lib.optionalString withSmokeShapes "--smoke"} \
      ${lib.optionalString (!flashinferNorm) "--no-flashinfer-norm"}
  ''
