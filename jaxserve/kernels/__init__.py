"""Native kernels the XLA backends lack: ``jaxserve.kernels.cpu`` (AVX-512 or AVX2 weight-only matmuls as XLA FFI calls)."""
