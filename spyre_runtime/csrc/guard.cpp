#include "guard.h"

#include "allocator.h"
#include "runtime_bridge.h"

#include <c10/core/DeviceCapability.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

namespace spyre {

namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

thread_local c10::DeviceIndex tl_device = 0;
// Current stream id per device, for this thread; 0 is the default stream.
thread_local std::vector<c10::StreamId> tl_streams;

std::mutex g_streams_mu;
std::vector<c10::StreamId> g_next_stream;                     // per device
std::map<std::pair<int, c10::StreamId>, int> g_priorities;    // (device, id)

std::atomic<uint64_t> g_next_event{1};

void check_device(c10::DeviceIndex index) {
  TORCH_CHECK_INDEX(
      index >= 0 && index < device_count(),
      "spyre: device index ", static_cast<int>(index),
      " is out of range; there are ", device_count(),
      " spyre devices (set SPYRE_NUM_DEVICES for more)");
}

c10::StreamId& current_stream_slot(c10::DeviceIndex index) {
  if (tl_streams.size() <= static_cast<size_t>(index)) {
    tl_streams.resize(index + 1, 0);
  }
  return tl_streams[index];
}

uint64_t event_id(void* event) {
  return reinterpret_cast<uintptr_t>(event);
}

struct SpyreGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kType;
  }

  c10::Device exchangeDevice(c10::Device d) const override {
    auto old = getDevice();
    if (d.index() != old.index()) {
      setDevice(d);
    }
    return old;
  }

  c10::Device getDevice() const override {
    return {kType, tl_device};
  }

  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "spyre guard given a ", d.type(), " device");
    check_device(d.index());
    tl_device = d.index();
  }

  void uncheckedSetDevice(c10::Device d) const noexcept override {
    tl_device = d.index();
  }

  c10::Stream getStream(c10::Device d) const override {
    const auto index = d.has_index() ? d.index() : tl_device;
    return c10::Stream(c10::Stream::UNSAFE, {kType, index}, current_stream_slot(index));
  }

  c10::Stream getDefaultStream(c10::Device d) const override {
    const auto index = d.has_index() ? d.index() : tl_device;
    return c10::Stream(c10::Stream::UNSAFE, {kType, index}, 0);
  }

  c10::Stream getStreamFromGlobalPool(c10::Device d, bool isHighPriority) const override {
    return getNewStream(d, isHighPriority ? -1 : 0);
  }

  c10::Stream getNewStream(c10::Device d, int priority) const override {
    const auto index = d.has_index() ? d.index() : tl_device;
    check_device(index);
    std::lock_guard<std::mutex> lock(g_streams_mu);
    if (g_next_stream.size() <= static_cast<size_t>(index)) {
      g_next_stream.resize(index + 1, 1);
    }
    const auto id = g_next_stream[index]++;
    g_priorities[{index, id}] = priority;
    return c10::Stream(c10::Stream::UNSAFE, {kType, index}, id);
  }

  c10::Stream exchangeStream(c10::Stream s) const override {
    auto& slot = current_stream_slot(s.device_index());
    const auto old = slot;
    slot = s.id();
    return c10::Stream(c10::Stream::UNSAFE, s.device(), old);
  }

  // Events are ids; what an event means (the internal signal of its latest
  // record, its simulated time) lives in the queue layer.
  void destroyEvent(void* event, const c10::DeviceIndex /*device*/) const noexcept override {
    if (event != nullptr) {
      bridge::event_destroy(event_id(event));
    }
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device,
              const c10::EventFlag /*flag*/) const override {
    TORCH_CHECK(device == -1 || device == stream.device_index(),
                "spyre: event on device ", static_cast<int>(device),
                " cannot be recorded on a stream of device ",
                static_cast<int>(stream.device_index()));
    if (*event == nullptr) {
      *event = reinterpret_cast<void*>(static_cast<uintptr_t>(g_next_event++));
    }
    bridge::event_record(event_id(*event), stream.device_index(), stream.id());
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event != nullptr) {  // never recorded: nothing to wait for, as on CUDA
      bridge::event_block(event_id(event), stream.device_index(), stream.id());
    }
  }

  bool queryEvent(void* event) const override {
    return event == nullptr || bridge::event_query(event_id(event));
  }

  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return static_cast<c10::DeviceIndex>(device_count());
    } catch (...) {
      return 0;
    }
  }

  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    check_device(d.has_index() ? d.index() : tl_device);
    // Every dtype has a path (compiled or the CPU fallback); the default
    // capability already says so.
    return c10::DeviceCapability();
  }

  bool queryStream(const c10::Stream& stream) const override {
    return bridge::stream_query(stream.device_index(), stream.id());
  }

  void synchronizeStream(const c10::Stream& stream) const override {
    bridge::stream_synchronize(stream.device_index(), stream.id());
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      bridge::event_synchronize(event_id(event));
    }
  }

  void synchronizeDevice(const c10::DeviceIndex device) const override {
    check_device(device);
    bridge::device_synchronize(device);
  }

  void recordDataPtrOnStream(const c10::DataPtr& ptr, const c10::Stream& stream) const override {
    device_allocator().recordStream(ptr, stream);
  }

  double elapsedTime(void* start, void* end, const c10::DeviceIndex /*device*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "spyre: both events must be recorded before elapsed_time");
    return bridge::event_elapsed_ms(event_id(start), event_id(end));
  }
};

}  // namespace

c10::DeviceIndex current_device() {
  return tl_device;
}

void set_current_device(c10::DeviceIndex device) {
  check_device(device);
  tl_device = device;
}

c10::StreamId current_stream_id(c10::DeviceIndex device) {
  return current_stream_slot(device);
}

int stream_priority(c10::DeviceIndex device, c10::StreamId id) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  auto it = g_priorities.find({device, id});
  return it == g_priorities.end() ? 0 : it->second;
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, SpyreGuardImpl);

}  // namespace spyre
