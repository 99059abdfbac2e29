#include "runtime_bridge.h"

#include <c10/util/Exception.h>
#include <torch/extension.h>

#include <atomic>

namespace spyre::bridge {

namespace {

// Leaked on purpose: it must outlive every C++ caller, including static
// destructors running after the interpreter is gone.
std::atomic<py::object*> g_runtime{nullptr};

// A Python exception raised by the runtime propagates as the
// py::error_already_set that carries it: torch's HANDLE_TH_ERRORS and pybind11
// restore it, so the caller of torch.spyre.synchronize(), stream.synchronize(),
// event.synchronize(), stream.query() ... gets the original exception, with its
// type, message and traceback (a StreamError naming the failed operation; a
// KeyboardInterrupt if Ctrl-C arrives during a wait). Converting it to a
// c10::Error would turn every one of them into a RuntimeError.
//
// Callers that must not throw (destructors: event_destroy) catch everything
// themselves. Other C++ callers (e.g. the autograd engine's worker threads,
// recording events) see a std::exception, as they would see a c10::Error; the
// exception object takes the GIL itself when it is destroyed.
template <typename... Args>
py::object call(const char* method, Args&&... args) {
  py::gil_scoped_acquire gil;
  return g_runtime.load()->attr(method)(std::forward<Args>(args)...);
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
