// Python bindings of the C++ part: configuration, device memory introspection,
// stream priorities, default generators and host aliases.
#include "allocator.h"
#include "guard.h"
#include "hooks.h"
#include "kernels.h"

#include <torch/csrc/Generator.h>
#include <torch/extension.h>

namespace {

py::object default_generator(int device) {
  return py::reinterpret_steal<py::object>(
      THPGenerator_initDefaultGenerator(spyre::default_generator(static_cast<c10::DeviceIndex>(device))));
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "C++ part of the spyre device: allocator, guard, hooks, memory kernels";
  m.def("configure", &spyre::configure, py::arg("num_devices"), py::arg("capacity_bytes"),
        "Set the device count and per-device memory before first use.");
  m.def("device_count", &spyre::device_count);
  m.def("device_capacity", &spyre::device_capacity);
  m.def("current_device", [] { return static_cast<int>(spyre::current_device()); });
  m.def("set_device", [](int d) { spyre::set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("stream_priority", [](int device, int64_t id) {
    return spyre::stream_priority(static_cast<c10::DeviceIndex>(device), id);
  });
  m.def("default_generator", &default_generator, py::arg("device"));
  m.def("host_alias", &spyre::host_alias, py::arg("tensor"),
        "A CPU tensor viewing the same bytes as a spyre tensor.");
  m.def("device_offset", [](uintptr_t ptr) {
    return spyre::device_allocator().offset_of(reinterpret_cast<void*>(ptr));
  }, "Offset of a device pointer from the start of its device's memory.");
}
