# libcufile_rdma.so.1 (GPUDirect Storage over RDMA) links libibverbs, librdmacm and libmlx5.
{ pkgs, ... }:
prev: {
  buildInputs = prev.buildInputs ++ [ pkgs.rdma-core ];
}
