# NVSHMEM's transport and bootstrap plugins are dlopened only when selected (multi-node
# InfiniBand, UCX, libfabric, MPI, PMIx). libmlx5 comes from rdma-core; the MPI-family
# libraries are left out of the closure: a single host never loads those plugins.
{ pkgs, ... }:
prev: {
  buildInputs = prev.buildInputs ++ [ pkgs.rdma-core ];
  autoPatchelfIgnoreMissingDeps = prev.autoPatchelfIgnoreMissingDeps ++ [
    "libucp.so.0"
    "libucs.so.0"
    "libfabric.so.1"
    "libpmix.so.2"
    "libmpi.so.40"
    "liboshmem.so.40"
  ];
}
