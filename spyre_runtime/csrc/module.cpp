// Python bindings of the C++ part: configuration, device memory introspection,
// stream priorities, default generators and host aliases.
#include "allocator.h"
#include "guard.h"
#include "hooks.h"
#include "kernels.h"

#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/device_lazy_init.h>
#include <torch/extension.h>

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>

// OpenMP's and MKL's thread counts can be set per calling thread; torch.set_num_threads would
// also change the count every later thread starts with (a process-wide default the user owns).
// MKL's thread-local setter is called by its Fortran name, which takes a pointer (the C name
// in this build is the same symbol); weak, as a torch built without MKL has none.
extern "C" {
int omp_get_max_threads(void);
void omp_set_num_threads(int);
int mkl_set_num_threads_local_(const int*) __attribute__((weak));
}

namespace spyre::bridge {
void set_runtime(py::object runtime);
}

namespace spyre::profiler {
void set_hooks(py::object start, py::object stop, py::object collect);
uint64_t current_correlation();
void register_profiler();
}

namespace {

// The calling thread's intra-op thread counts set to (omp, mkl): OpenMP's, and MKL's
// thread-local one (0: MKL's process default); returns the pair it had, to set back.
std::pair<int, int> set_intraop_threads(int omp, int mkl) {
  TORCH_CHECK(omp > 0 && mkl >= 0, "set_intraop_threads: expected omp > 0 and mkl >= 0, got ", omp, " and ", mkl);
  at::internal::lazy_init_num_threads();  // first, or torch's lazy init would undo it later
  int previous = omp_get_max_threads();
  if (previous != omp) omp_set_num_threads(omp);
  return {previous, mkl_set_num_threads_local_ != nullptr ? mkl_set_num_threads_local_(&mkl) : 0};
}

// copy_'s memory-overlap checks, as the CPU and CUDA copies make them (Copy.cpp: a copy onto
// itself, or onto a view of the same data, is a no-op; otherwise TensorIterator refuses a
// destination whose elements share memory and a source that partly overlaps it). A spyre copy
// reaches _copy_from before any TensorIterator, so they are made here, in PyTorch's words.
void check_copy_overlap(const at::Tensor& dst, const at::Tensor& src) {
  if (dst.is_same(src)) {
    return;
  }
  const bool same_data = dst.is_alias_of(src) && dst.storage_offset() == src.storage_offset() &&
                         dst.strides().equals(src.strides()) && dst.sizes().equals(src.sizes()) &&
                         dst.scalar_type() == src.scalar_type() && dst.is_conj() == src.is_conj() &&
                         dst.is_neg() == src.is_neg();
  if (same_data) {
    return;
  }
  at::assert_no_internal_overlap(dst);
  at::assert_no_partial_overlap(dst, src);
}

py::object default_generator(int device) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(spyre::default_generator(static_cast<c10::DeviceIndex>(device))));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "C++ part of the spyre device: allocator, guard, hooks, memory kernels";
  // The devices are ready as soon as this module is loaded. Tell torch, whose
  // lazy-init flag for PrivateUse1 otherwise stays unset until something
  // queries the device or creates a tensor; until then
  // torch.accelerator.synchronize(i) (and so torch.spyre.synchronize()) returns
  // without waiting, dropping work already enqueued and its errors.
  torch::utils::set_requires_device_init(c10::DeviceType::PrivateUse1, false);
  spyre::profiler::register_profiler();  // torch.profiler's PrivateUse1 activities (profiler.cpp)
  m.def("set_profiler_hooks", &spyre::profiler::set_hooks, py::arg("start"), py::arg("stop"), py::arg("collect"),
        "The Python side of the Kineto plugin: start and stop recording, and the operations recorded");
  m.def("profiler_correlation", &spyre::profiler::current_correlation,
        "The correlation id of the CPU op this thread is in while torch.profiler records (0: none)");
  m.def("configure", &spyre::configure, py::arg("num_devices"), py::arg("capacity_bytes"),
        py::arg("region_handles"), py::arg("mode"),
        "Set the device count, per-device memory and region handle budget before first use.");
  m.def("device_count", &spyre::device_count);
  m.def("region_epoch", &spyre::region_epoch,
        "Changes whenever a region is released (empty_cache or an out-of-memory retry): "
        "cached (region, offset) descriptions of device addresses are valid while it is unchanged.");
  m.def("device_capacity", &spyre::device_capacity);
  m.def("current_device", [] { return static_cast<int>(spyre::current_device()); });
  m.def("set_device", [](int d) { spyre::set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("current_stream_id", [](int device) {
    return spyre::current_stream_id(static_cast<c10::DeviceIndex>(device));
  });
  m.def("stream_priority", [](int device, int64_t id) {
    return spyre::stream_priority(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("default_generator", &default_generator, py::arg("device"));
  m.def("check_copy_overlap", &check_copy_overlap, py::arg("dst"), py::arg("src"),
        "Raise PyTorch's error if copy_(dst, src) writes memory that dst's elements share or that "
        "src partly overlaps (a copy onto the same data is allowed).");
  m.def("philox_reserve", [](py::handle generator, uint64_t counters) {
    TORCH_CHECK_TYPE(THPGenerator_Check(generator.ptr()), "philox_reserve: expected a torch.Generator");
    const auto [seed, offset] = spyre::philox_reserve(reinterpret_cast<THPGenerator*>(generator.ptr())->cdata,
                                                      counters);
    return py::make_tuple(seed, offset);
  }, py::arg("generator"), py::arg("counters"),
        "(seed, offset) for a fill drawing `counters` Philox counters from a spyre generator, "
        "its offset advanced past them atomically.");
  m.def("set_twister_state", [](py::handle generator, const at::Tensor& twister) {
    TORCH_CHECK_TYPE(THPGenerator_Check(generator.ptr()), "set_twister_state: expected a torch.Generator");
    spyre::set_twister_state(reinterpret_cast<THPGenerator*>(generator.ptr())->cdata, twister);
  }, py::arg("generator"), py::arg("twister"),
        "Set a spyre generator's Mersenne Twister state, its Philox seed and offset kept, atomically.");
  m.def("host_alias", &spyre::host_alias, py::arg("tensor"),
        "A CPU tensor viewing the same bytes as a spyre tensor.");
  m.def("describe", [](uintptr_t ptr) {
    py::list pieces;
    for (const auto& p : spyre::device_allocator().describe(reinterpret_cast<void*>(ptr))) {
      pieces.append(py::make_tuple(p.region, p.offset, p.length));
    }
    return pieces;
  }, py::arg("ptr"), "(region, offset, length) pieces of the allocation starting at ptr.");
  m.def("region_info", [](int device) {
    const auto info = spyre::device_allocator().region_info(static_cast<c10::DeviceIndex>(device));
    py::dict d;
    d["mode"] = info.mode;
    d["region_budget"] = info.region_budget;
    d["regions"] = info.regions;
    d["min_region_bytes"] = info.min_region_bytes;
    d["free_in_regions"] = info.free_in_regions;
    d["largest_free_block"] = info.largest_free_block;
    d["fragmentation"] = info.fragmentation;
    return d;
  }, py::arg("device"));
  m.def("regions", [](int device) {
    return spyre::device_allocator().regions(static_cast<c10::DeviceIndex>(device));
  }, py::arg("device"), "(handle, size, live blocks) of each region of a device.");
  m.def("set_runtime", &spyre::bridge::set_runtime, py::arg("runtime"),
        "Register the queue layer that answers stream and event calls.");
  // The queue calls these on every enqueue and completion, holding the GIL. They keep it:
  // letting it go hands it to a queue worker, and the caller then waits for the worker's
  // whole operation (tens of microseconds per launch). Keeping it cannot deadlock: the
  // allocator's lock is never held by code that takes the GIL (allocator.cpp calls no Python).
  m.def("note_enqueued", [](int device, int64_t stream, int64_t seq) {
    spyre::note_enqueued(static_cast<c10::DeviceIndex>(device), stream, seq);
  });
  m.def("note_completed", [](int device, int64_t stream, int64_t seq) {
    spyre::note_completed(static_cast<c10::DeviceIndex>(device), stream, seq);
  });
  m.def("watch_allocations", [](int device, bool on) {
    spyre::watch_allocations(static_cast<c10::DeviceIndex>(device), on);
  }, py::arg("device"), py::arg("on"), "Note (or stop noting) the blocks a device's allocator hands out.");
  m.def("take_allocations", [](int device) {
    return spyre::take_allocations(static_cast<c10::DeviceIndex>(device));
  }, py::arg("device"), "(region, offset in region, length) of each block handed out since the last call.");
  m.def("pending_free_bytes", [](int device) {
    return spyre::device_allocator().pending_free_bytes(static_cast<c10::DeviceIndex>(device));
  });
  m.def("region_address", [](int device, int64_t handle) {
    return reinterpret_cast<uintptr_t>(
        spyre::device_allocator().region_address(static_cast<c10::DeviceIndex>(device), handle));
  });
  m.def("set_intraop_threads", &set_intraop_threads, py::arg("omp"), py::arg("mkl"),
        "Set the calling thread's intra-op thread counts (OpenMP; MKL's thread-local one, 0 for "
        "MKL's default), not the process default torch.set_num_threads also changes; returns the "
        "previous pair.");
  m.def("device_offset", [](uintptr_t ptr) {
    return spyre::device_allocator().offset_of(reinterpret_cast<void*>(ptr));
  }, "Offset of a device pointer from the start of its device's memory.");
}
