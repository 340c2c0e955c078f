"""Triton kernels of sageattn3 (sm80 and newer): NVFP4 quantization and FP4-dequantizing attention."""
