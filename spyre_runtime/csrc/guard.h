// Device guard: the current device and stream of each thread, stream ids and
// priorities, and event identity. What streams and events do (ordering,
// completion, timing) is the queue layer's, reached through runtime_bridge.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace spyre {

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex device);
// Priority given to a stream when it was created (0 for the default stream;
// lower is more urgent, as on CUDA).
int stream_priority(c10::DeviceIndex device, c10::StreamId id);
// This thread's current stream on `device`.
c10::StreamId current_stream_id(c10::DeviceIndex device);

}  // namespace spyre
