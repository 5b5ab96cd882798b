"""Tensor-level operations behind the modules' fast paths.

Pure functions of tensors (no module state): oneDNN calls with fused
epilogues (:mod:`.onednn`), XCA from second moments (:mod:`.second_moments`),
XCA's attention core in Triton kernels for CUDA (:mod:`.xca_kernels`),
folding of BatchNorm and layer scale into weights (:mod:`.folding`), token
pieces for inference (:mod:`.pieces`) and the 2x2 transposed convolution as
a token GEMM (:mod:`.upsample`).
"""
