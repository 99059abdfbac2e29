// Simulated Spyre device memory and the c10 allocator that hands it out.
//
// Each device owns one virtual reservation (mmap with MAP_NORESERVE, so
// untouched bytes cost nothing). As on the card, memory is acquired in
// regions, each a contiguous chunk named by a handle, and a device has a small
// budget of handles (PF mode: card dedicated; VF mode: card shared, tighter).
// Blocks are sub-allocated inside regions on 128-byte (stick) boundaries, so
// many tensors share a handful of handles.
//
// Region size policy: a new region is max(request rounded up to 2 MiB,
// capacity / handle budget). With that minimum the budget can always cover
// the whole capacity, so the handle budget alone never makes memory
// unreachable; a large request gets a region of its own size. The last handle
// takes all that is left of the address space (the largest free range), and
// so does a region made where the usual size no longer fits, so no handle is
// spent on a sliver while the rest of the card stays out of reach. Wholly
// unused regions stay cached until empty_cache() or until an allocation needs
// their handle or address space.
//
// Handles are never reused: each region created gets the next number, per
// device. A released region's address range may be given to a new region
// (with a new handle); region_epoch() changes whenever that can happen.
//
// Streams: a freed block is reused only once every stream that used it (the
// stream current when it was allocated, plus any given to record_stream) has
// completed the work enqueued before the free, as with CUDA's caching
// allocator. The queue layer reports each stream's progress (note_enqueued /
// note_completed); until then the block stays allocated ("pending free").
//
// Device pointers are real host addresses inside the reservation: the
// simulator, the CPU fallback and copies all address the same bytes.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace spyre {

// Every block starts and ends on a stick boundary.
constexpr size_t kStickBytes = 128;

// Regions are created in multiples of this.
constexpr size_t kRegionGranularity = size_t(2) << 20;

// Called once, before the first allocation, from the Python side that owns the
// hardware configuration. Later calls with the same values are no-ops.
void configure(int num_devices, size_t capacity_bytes, int region_handles,
               const std::string& mode);
int device_count();
size_t device_capacity();

// Incremented (process-wide) every time a region is released, by
// empty_cache() or by an allocation's out-of-memory retry. A cache mapping
// device addresses to (region, offset) is valid while this is unchanged.
uint64_t region_epoch();

// Stream progress, from the queue layer: `seq` numbers increase per stream.
void note_enqueued(c10::DeviceIndex device, c10::StreamId stream, int64_t seq);
void note_completed(c10::DeviceIndex device, c10::StreamId stream, int64_t seq);

// Blocks handed out, for the queue layer's poison (memory a failed operation was to write):
// a block handed out anew holds uninitialized bytes, not a failed operation's missing output.
// While watched, every allocation of the device is noted (region handle, offset in region,
// length); take_allocations returns and forgets those noted so far. Unwatched costs nothing.
void watch_allocations(c10::DeviceIndex device, bool on);
std::vector<std::tuple<int64_t, size_t, size_t>> take_allocations(c10::DeviceIndex device);

// One contiguous piece of an allocation: a region handle and a byte range in it.
struct Piece {
  int64_t region;
  size_t offset;
  size_t length;
};

// What memory_stats() adds to c10's DeviceStats.
struct RegionInfo {
  std::string mode;
  int64_t region_budget;
  int64_t regions;
  size_t min_region_bytes;
  size_t free_in_regions;
  size_t largest_free_block;
  double fragmentation;  // 1 - largest free block / free bytes in regions
};

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
  // The pieces of the live allocation that starts at `ptr`.
  std::vector<Piece> describe(const void* ptr) const;
  RegionInfo region_info(c10::DeviceIndex device);
  // (handle, size in bytes, live blocks) of every region, in address order.
  std::vector<std::tuple<int64_t, size_t, size_t>> regions(c10::DeviceIndex device);
  // Bytes freed by PyTorch but still waiting for a stream to finish with them.
  size_t pending_free_bytes(c10::DeviceIndex device);
  // Address of a region's first byte (for transfers addressed by region).
  void* region_address(c10::DeviceIndex device, int64_t handle);
};

SpyreAllocator& device_allocator();

}  // namespace spyre
