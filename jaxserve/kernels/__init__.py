"""Native kernels the XLA backends lack: ``jaxserve.kernels.cpu`` (AVX-512 weight-only matmuls as XLA FFI calls)."""
