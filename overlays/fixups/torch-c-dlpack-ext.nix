# torch-c-dlpack-ext 0.1.5 ships its PEP 517 build backend as a top-level
# site-packages/build_backend.py, and so does flashinfer-python (different bytes): two files
# at one path make python.buildEnv (dflash-env, the dev shell) fail with a collision. Nothing
# imports it at run time, so it goes.
{ python, ... }:
prev: {
  postInstall = (prev.postInstall or "") + ''
    rm -f $out/${python.sitePackages}/build_backend.py \
      $out/${python.sitePackages}/__pycache__/build_backend.*.pyc
  '';
}
