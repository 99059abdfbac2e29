// Simulated Spyre device memory and the c10 allocator that hands it out.
//
// Each device owns one virtual reservation (mmap with MAP_NORESERVE, so
// untouched bytes cost nothing). Blocks are carved out of it on 128-byte
// (stick) boundaries. Device pointers are real host addresses inside that
// reservation: the simulator, the CPU fallback and copies all address the same
// bytes.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>

namespace spyre {

// Every block starts and ends on a stick boundary.
constexpr size_t kStickBytes = 128;

// Called once, before the first allocation, from the Python side that owns the
// hardware configuration. Later calls with the same values are no-ops.
void configure(int num_devices, size_t capacity_bytes);
int device_count();
size_t device_capacity();

class SpyreAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // The device whose reservation holds `ptr`, if any.
  std::optional<c10::DeviceIndex> device_of(const void* ptr) const;
  // Bytes from the start of that device's reservation.
  size_t offset_of(const void* ptr) const;
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
};

SpyreAllocator& device_allocator();

}  // namespace spyre
