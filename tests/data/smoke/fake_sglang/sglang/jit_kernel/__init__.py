"""Stand-in for sglang.jit_kernel: each loader "compiles" a module into tvm-ffi's cache (a
build.ninja, a pause, the .so) unless it is there, as tvm-ffi does (tests/smoke/test_smoke_startup.py)."""
