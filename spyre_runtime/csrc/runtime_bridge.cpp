#include "runtime_bridge.h"

#include <c10/util/Exception.h>
#include <torch/extension.h>

#include <atomic>

namespace spyre::bridge {

namespace {

// Leaked on purpose: it must outlive every C++ caller, including static
// destructors running after the interpreter is gone.
std::atomic<py::object*> g_runtime{nullptr};

template <typename... Args>
py::object call(const char* method, Args&&... args) {
  py::gil_scoped_acquire gil;
  try {
    return g_runtime.load()->attr(method)(std::forward<Args>(args)...);
  } catch (py::error_already_set& e) {
    // Surface the runtime's own message (it names the stream and operation).
    TORCH_CHECK(false, e.what());
  }
}

bool active() {
  return g_runtime.load() != nullptr && Py_IsInitialized();
}

}  // namespace

void set_runtime(py::object runtime) {
  g_runtime.store(new py::object(std::move(runtime)));
}

void event_record(uint64_t event, c10::DeviceIndex device, c10::StreamId stream) {
  if (active()) {
    call("event_record", event, static_cast<int>(device), stream);
  }
}

void event_block(uint64_t event, c10::DeviceIndex device, c10::StreamId stream) {
  if (active()) {
    call("event_block", event, static_cast<int>(device), stream);
  }
}

bool event_query(uint64_t event) {
  return !active() || call("event_query", event).cast<bool>();
}

void event_synchronize(uint64_t event) {
  if (active()) {
    call("event_synchronize", event);
  }
}

double event_elapsed_ms(uint64_t start, uint64_t end) {
  TORCH_CHECK(active(), "spyre: the queue layer is not running; elapsed_time is unavailable");
  return call("event_elapsed_ms", start, end).cast<double>();
}

void event_destroy(uint64_t event) noexcept {
  try {
    if (active()) {
      call("event_destroy", event);
    }
  } catch (...) {
    // Destroying an event must never throw (it runs from destructors).
  }
}

bool stream_query(c10::DeviceIndex device, c10::StreamId stream) {
  return !active() || call("stream_query", static_cast<int>(device), stream).cast<bool>();
}

void stream_synchronize(c10::DeviceIndex device, c10::StreamId stream) {
  if (active()) {
    call("stream_synchronize", static_cast<int>(device), stream);
  }
}

void device_synchronize(c10::DeviceIndex device) {
  if (active()) {
    call("device_synchronize", static_cast<int>(device));
  }
}

}  // namespace spyre::bridge
