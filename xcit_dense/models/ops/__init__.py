"""Tensor-level operations behind the modules' fast paths.

Functions of tensors: oneDNN calls with fused epilogues (:mod:`.onednn`),
XCA from second moments (:mod:`.second_moments`), XCA's attention core and
LPI's branch in Triton kernels for CUDA (:mod:`.xca_kernels`,
:mod:`.lpi_kernels`, which takes the branch's layers so as to keep
BatchNorm's running averages as its forward does), folding of BatchNorm and
layer scale into weights (:mod:`.folding`), the linear layers' weights cast
to autocast's dtype together (:mod:`.casts`), token pieces for inference
(:mod:`.pieces`) and the 2x2 transposed convolution as a token GEMM
(:mod:`.upsample`); Triton where it exists, and whether the kernels work on
a device (:mod:`.triton_support`); second derivatives through the autograd
functions among them (:mod:`.higher_order`).
"""
