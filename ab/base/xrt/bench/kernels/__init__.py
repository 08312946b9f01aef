"""The kernels scenario (`python -m xrt bench bench.scenario=kernels`): each kernel xrt runs on CUDA against its
reference, at the model's shapes: the Triton elementwise kernels against torch, the skinny GEMM against
F.linear, the split-KV decode attention against FlashInfer, and FlashInfer's own decode settings. CUDA only."""
