#pragma once

#include <ATen/core/Tensor.h>

namespace spyre {

// A CPU tensor over the same bytes as a spyre tensor (same sizes, strides and
// offset). It keeps the device storage alive. CPU tensors are returned as is.
at::Tensor host_alias(const at::Tensor& t);

}  // namespace spyre
