// The device guard's stream and event operations, answered by the Python
// queue layer (spyre_runtime.queue) once it registers itself. Before that (or
// at interpreter shutdown) the device behaves as synchronous: every stream is
// idle and every event complete.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

#include <cstdint>

namespace spyre::bridge {

void event_record(uint64_t event, c10::DeviceIndex device, c10::StreamId stream);
void event_block(uint64_t event, c10::DeviceIndex device, c10::StreamId stream);
bool event_query(uint64_t event);
void event_synchronize(uint64_t event);
double event_elapsed_ms(uint64_t start, uint64_t end);
void event_destroy(uint64_t event) noexcept;
bool stream_query(c10::DeviceIndex device, c10::StreamId stream);
void stream_synchronize(c10::DeviceIndex device, c10::StreamId stream);
void device_synchronize(c10::DeviceIndex device);

}  // namespace spyre::bridge
