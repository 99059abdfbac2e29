// The memory and view kernels PyTorch needs in C++ for a device of its own:
// allocation, views, storage swaps and resizes. Copies and scalar reads go
// through the queue layer and live in Python (spyre_inductor/device/copies.py),
// as does the CPU fallback for every other op.
//
// host_alias views a device tensor's bytes as a CPU tensor with the same sizes
// and strides: in the simulator device memory is host-addressable.
#include "allocator.h"
#include "kernels.h"
#include "runtime_bridge.h"

#include <ATen/EmptyTensor.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/resize_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace spyre {

at::Tensor host_alias(const at::Tensor& t) {
  if (!t.is_privateuseone()) {
    return t;
  }
  // The alias keeps the device storage alive for as long as it lives.
  c10::Storage keep = t.storage();
  // A storage resized under the tensor (t.untyped_storage().resize_(0)) no
  // longer holds the bytes the tensor names: refuse, as the CPU would not.
  if (t.numel() > 0) {
    int64_t last = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      if (t.stride(d) > 0) {
        last += (t.size(d) - 1) * t.stride(d);
      }
    }
    const auto reach = static_cast<size_t>(last + 1) * t.element_size();
    TORCH_CHECK(reach <= keep.nbytes(), "spyre: a tensor of shape ", t.sizes(), " reaches byte ", reach,
                " of its storage, which holds ", keep.nbytes(), " bytes (was the storage resized under it?)");
  }
  return at::for_blob(t.data_ptr(), t.sizes())
      .strides(t.strides())
      .deleter([keep](void*) {})
      .options(t.options().device(at::kCPU))
      .make_tensor();
}

namespace {

constexpr c10::DispatchKeySet kSpyreKeys(c10::DispatchKey::PrivateUse1);

at::Tensor empty_memory_format(
    c10::IntArrayRef size,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "spyre: only strided tensors are supported, got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "spyre: pin_memory applies to CPU tensors only");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, &device_allocator(), kSpyreKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size,
    c10::IntArrayRef stride,
    std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout,
    std::optional<c10::Device> device,
    std::optional<bool> pin_memory) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "spyre: only strided tensors are supported, got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory),
              "spyre: pin_memory applies to CPU tensors only");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, &device_allocator(), kSpyreKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                      c10::SymIntArrayRef stride, std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                         std::optional<c10::MemoryFormat> memory_format) {
  // The CPU resize grows storage through the storage's own allocator, which
  // for a spyre tensor is the device allocator, and copies the old bytes on
  // the host: queued work writing them must finish first. A storage of no
  // bytes (a fresh out= tensor) has nothing to copy and nothing to wait for:
  // synchronizing would also raise any other stream's failure here.
  const c10::DeviceGuard guard(self.device());
  const auto needed = at::detail::computeStorageNbytesContiguous(
      C10_AS_INTARRAYREF_SLOW(size), self.dtype().itemsize(), self.storage_offset());
  if (self.storage() && self.storage().nbytes() > 0 && needed > self.storage().nbytes()) {
    bridge::device_synchronize(self.device().index());
  }
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), 0, &device_allocator(), true);
  return at::cpu::set_(self, storage, 0, {0}, {});
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  return at::native::set_(self, std::move(source));
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                               c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "spyre: set_ expects a spyre storage, got one on ", source.device());
  return at::cpu::set_(self, std::move(source), offset.expect_int(),
                       C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

void record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "spyre: record_stream expects a spyre stream, got one on ", stream.device());
  device_allocator().recordStream(self.storage().data_ptr(), stream);
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("set_", set_empty);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("record_stream", record_stream);
}

// The cast rules are Python kernels (spyre_inductor/device/autocast.py); every op without one
// falls through and runs in the dtypes it was given.
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

namespace {

// What a cast rule casts an argument with: autocast's own cached cast, so a weight (an fp32
// leaf that requires grad) is cast to the autocast dtype once per autocast region, however many
// ops use it, and the cache is the one torch.autocast clears when its outermost region exits.
// It has no Python binding: hence this op.
at::Tensor autocast_cast(const at::Tensor& self, at::ScalarType dtype) {
  return at::autocast::cached_cast(dtype, self, c10::DeviceType::PrivateUse1);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(spyre, m) {
  m.def("autocast_cast(Tensor self, ScalarType dtype) -> Tensor");
}

// Composite: the cast inside (Tensor.to) is what autograd records.
TORCH_LIBRARY_IMPL(spyre, CompositeImplicitAutograd, m) {
  m.impl("autocast_cast", autocast_cast);
}

}  // namespace spyre
