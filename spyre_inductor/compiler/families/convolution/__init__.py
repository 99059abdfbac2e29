"""The conv family: conv2d as an implicit GEMM on the PE arrays (issue 31)."""
