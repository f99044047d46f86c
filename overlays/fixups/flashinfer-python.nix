# flashinfer-python 0.6.8.post1 ships its PEP 517 build backend as a top-level
# site-packages/build_backend.py, and so does torch-c-dlpack-ext (different bytes): two files
# at one path make python.buildEnv (dflash-env, the dev shell) fail with a collision. Nothing
# imports it at run time, so it goes.
{ python, ... }:
prev: {
  postInstall = (prev.postInstall or "") + ''
    rm -f $out/${python.sitePackages}/build_backend.py \
      $out/${python.sitePackages}/__pycache__/build_backend.*.pyc
  '';
}
