// Device guard: the current device and stream of each thread, stream ids and
// priorities, and event identity.
//
// The device is synchronous for now: every operation has finished when the
// call that enqueued it returns, so streams are always idle and a recorded
// event is complete at once. Events still carry their identity, stream and
// the time they were recorded, so elapsed_time and query behave as on CUDA.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace spyre {

c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex device);
// Priority given to a stream when it was created (0 for the default stream;
// lower is more urgent, as on CUDA).
int stream_priority(c10::DeviceIndex device, c10::StreamId id);

}  // namespace spyre
