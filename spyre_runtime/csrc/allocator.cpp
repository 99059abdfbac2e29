#include "allocator.h"

#include "free_list.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace spyre {

using c10::CachingAllocator::StatType;
using c10::CachingDeviceAllocator::DeviceStats;

namespace {

// CUDA's split between small and large pools; kept so memory_stats() has the
// same keys with the same meaning.
constexpr size_t kSmallBlockLimit = 1 << 20;

// Bumped whenever a region is released (process-wide: one counter for every
// device); see region_epoch().
std::atomic<uint64_t> g_region_epoch{0};

size_t round_up(size_t n, size_t unit) {
  return (n + unit - 1) / unit * unit;
}

struct Region {
  int64_t handle;
  size_t base;  // offset of the region in the device's reservation
  FreeList blocks;
  size_t live = 0;  // blocks allocated in it
};

struct Block {
  Region* region;
  size_t length;
  size_t requested;
  std::vector<c10::StreamId> streams;  // the allocation stream, then recorded ones
};

// A block PyTorch freed while some stream that used it still had work queued:
// it is released once each stream's completed seq reaches its target.
struct PendingFree {
  size_t offset;
  std::vector<std::pair<c10::StreamId, int64_t>> targets;
};

struct StreamProgress {
  int64_t enqueued = 0;
  int64_t completed = 0;
};

// One device's memory. Everything is guarded by `mu` except `base`, which is
// written once (under `mu`) and then only read.
struct DeviceMemory {
  std::mutex mu;
  std::atomic<char*> base{nullptr};
  size_t capacity = 0;
  int64_t budget = 0;
  std::string mode;
  std::unique_ptr<FreeList> address_space;             // where regions go
  std::map<size_t, std::unique_ptr<Region>> regions;   // by base offset
  std::unordered_map<size_t, Block> live;              // by device offset
  int64_t next_handle = 1;
  size_t allocated = 0;
  DeviceStats stats;
  std::unordered_map<c10::StreamId, StreamProgress> progress;
  std::vector<PendingFree> pending;
  size_t pending_bytes = 0;
  bool watching = false;  // note allocations (see watch_allocations)
  std::vector<std::tuple<int64_t, size_t, size_t>> handed_out;

  void release_block_locked(size_t offset) {
    auto it = live.find(offset);
    TORCH_INTERNAL_ASSERT(it != live.end(), "spyre: double free at device offset ", offset);
    const Block block = it->second;
    live.erase(it);
    block.region->blocks.give(offset - block.region->base, block.length);
    block.region->live -= 1;
    allocated -= block.length;
    count_block_locked(block.length, block.requested, false);
  }

  bool done_locked(const PendingFree& p) const {
    for (const auto& [stream, target] : p.targets) {
      auto it = progress.find(stream);
      if (it != progress.end() && it->second.completed < target) {
        return false;
      }
    }
    return true;
  }

  void process_pending_locked() {
    if (pending.empty()) {
      return;
    }
    std::vector<PendingFree> still;
    for (auto& p : pending) {
      if (done_locked(p)) {
        pending_bytes -= live.at(p.offset).length;
        release_block_locked(p.offset);
      } else {
        still.push_back(std::move(p));
      }
    }
    pending.swap(still);
  }

  size_t min_region() const {
    return std::max(kRegionGranularity, capacity / budget / kRegionGranularity * kRegionGranularity);
  }

  void reserve_locked(c10::DeviceIndex index) {
    if (base.load() != nullptr) {
      return;
    }
    void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TORCH_CHECK(p != MAP_FAILED, "spyre:", static_cast<int>(index), ": could not reserve ",
                capacity, " bytes of virtual address space for device memory: ",
                std::strerror(errno));
    address_space = std::make_unique<FreeList>(capacity);
    base.store(static_cast<char*>(p));
  }

  // The region whose free list holds the tightest fit for `length`.
  Region* best_region_locked(size_t length) {
    Region* best = nullptr;
    size_t best_len = 0;
    for (auto& [_, region] : regions) {
      const size_t fit = region->blocks.best_fit_length(length);
      if (fit != 0 && (best == nullptr || fit < best_len)) {
        best = region.get();
        best_len = fit;
      }
    }
    return best;
  }

  // `length` is a multiple of kStickBytes.
  Region* new_region_locked(size_t length) {
    const auto in_use = static_cast<int64_t>(regions.size());
    if (in_use >= budget) {
      return nullptr;
    }
    // What is left of the address space that one region can cover. Region
    // sizes and the capacity are whole sticks, so this is too.
    const size_t rest = address_space->largest();
    if (rest < length) {
      return nullptr;
    }
    size_t size = std::max(round_up(length, kRegionGranularity), min_region());
    if (in_use + 1 == budget || size > rest) {
      // The last handle takes everything that is left: a region of the usual
      // size would leave the rest of the card unreachable (no handle could
      // ever name it). Likewise near the end of the capacity, where the usual
      // size no longer fits: the region takes what is left, not just the
      // request, or each small request there would spend a handle of its own.
      size = rest;
    }
    const auto where = address_space->take(size);
    TORCH_INTERNAL_ASSERT(where.has_value(), "spyre: the largest free range of the address space is gone");
    return add_region_locked(*where, size);
  }

  Region* add_region_locked(size_t where, size_t size) {
    auto region = std::make_unique<Region>(Region{next_handle++, where, FreeList(size)});
    Region* r = region.get();
    regions[where] = std::move(region);
    for (auto type : {StatType::AGGREGATE, pool(size)}) {
      stats.segment[static_cast<size_t>(type)].increase(1);
      stats.reserved_bytes[static_cast<size_t>(type)].increase(size);
    }
    stats.num_device_alloc += 1;
    return r;
  }

  // Returns wholly unused regions (and their physical pages) to the device.
  size_t release_unused_locked() {
    size_t released = 0;
    for (auto it = regions.begin(); it != regions.end();) {
      Region& r = *it->second;
      if (r.live != 0) {
        ++it;
        continue;
      }
      const size_t size = r.blocks.size();
      madvise(base.load() + r.base, size, MADV_DONTNEED);
      address_space->give(r.base, size);
      for (auto type : {StatType::AGGREGATE, pool(size)}) {
        stats.segment[static_cast<size_t>(type)].decrease(1);
        stats.reserved_bytes[static_cast<size_t>(type)].decrease(size);
      }
      stats.num_device_free += 1;
      it = regions.erase(it);
      ++released;
      // Caches of "which region holds this address" are now stale: a new
      // region may be created at the same address under another handle.
      g_region_epoch.fetch_add(1, std::memory_order_release);
    }
    return released;
  }

  size_t free_in_regions_locked() const {
    size_t total = 0;
    for (const auto& [_, r] : regions) {
      total += r->blocks.free_bytes();
    }
    return total;
  }

  size_t largest_free_locked() const {
    size_t largest = 0;
    for (const auto& [_, r] : regions) {
      largest = std::max(largest, r->blocks.largest());
    }
    return largest;
  }

  static StatType pool(size_t length) {
    return length <= kSmallBlockLimit ? StatType::SMALL_POOL : StatType::LARGE_POOL;
  }

  void count_block_locked(size_t length, size_t requested, bool add) {
    for (auto type : {StatType::AGGREGATE, pool(length)}) {
      const auto i = static_cast<size_t>(type);
      if (add) {
        stats.allocation[i].increase(1);
        stats.active[i].increase(1);
        stats.allocated_bytes[i].increase(length);
        stats.active_bytes[i].increase(length);
        stats.requested_bytes[i].increase(requested);
      } else {
        stats.allocation[i].decrease(1);
        stats.active[i].decrease(1);
        stats.allocated_bytes[i].decrease(length);
        stats.active_bytes[i].decrease(length);
        stats.requested_bytes[i].decrease(requested);
      }
    }
  }
};

std::mutex g_config_mu;
int g_num_devices = 1;
size_t g_capacity = size_t(128) << 30;
int g_region_handles = 256;
std::string g_mode = "pf";
std::vector<std::unique_ptr<DeviceMemory>> g_devices;
std::atomic<bool> g_configured{false};

void ensure_devices() {
  if (g_configured.load()) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_configured.load()) {
    return;
  }
  g_devices.clear();
  for (int i = 0; i < g_num_devices; ++i) {
    auto mem = std::make_unique<DeviceMemory>();
    mem->capacity = g_capacity;
    mem->budget = g_region_handles;
    mem->mode = g_mode;
    g_devices.push_back(std::move(mem));
  }
  g_configured.store(true);
}

DeviceMemory& memory(c10::DeviceIndex device) {
  ensure_devices();
  TORCH_CHECK_INDEX(device >= 0 && device < static_cast<int>(g_devices.size()),
                    "spyre: device index ", static_cast<int>(device),
                    " is out of range; there are ", g_devices.size(),
                    " spyre devices (set SPYRE_NUM_DEVICES for more)");
  return *g_devices[device];
}

std::pair<DeviceMemory*, size_t> locate(const void* ptr) {
  ensure_devices();
  const char* p = static_cast<const char*>(ptr);
  for (auto& mem : g_devices) {
    const char* base = mem->base.load();
    if (base != nullptr && p >= base && p < base + mem->capacity) {
      return {mem.get(), static_cast<size_t>(p - base)};
    }
  }
  return {nullptr, 0};
}

void free_block(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  auto [mem, offset] = locate(ptr);
  TORCH_INTERNAL_ASSERT(mem != nullptr, "spyre: freeing a pointer that is not device memory");
  std::lock_guard<std::mutex> lock(mem->mu);
  auto it = mem->live.find(offset);
  TORCH_INTERNAL_ASSERT(it != mem->live.end(), "spyre: double free at device offset ", offset);
  PendingFree p{offset, {}};
  for (auto stream : it->second.streams) {
    auto prog = mem->progress.find(stream);
    if (prog != mem->progress.end() && prog->second.completed < prog->second.enqueued) {
      p.targets.emplace_back(stream, prog->second.enqueued);
    }
  }
  if (p.targets.empty()) {
    mem->release_block_locked(offset);
  } else {
    mem->pending_bytes += it->second.length;
    mem->pending.push_back(std::move(p));
  }
}

c10::StreamId current_stream_of(c10::DeviceIndex device) {
  if (auto impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
    return impl->getStream(c10::Device(c10::DeviceType::PrivateUse1, device)).id();
  }
  return 0;
}

}  // namespace

void configure(int num_devices, size_t capacity_bytes, int region_handles, const std::string& mode) {
  TORCH_CHECK(num_devices >= 1 && num_devices <= 64,
              "spyre: SPYRE_NUM_DEVICES must be between 1 and 64, got ", num_devices);
  TORCH_CHECK(capacity_bytes >= kRegionGranularity && capacity_bytes % kStickBytes == 0,
              "spyre: device memory capacity must be a multiple of ", kStickBytes,
              " bytes and at least ", kRegionGranularity, ", got ", capacity_bytes);
  TORCH_CHECK(region_handles >= 1, "spyre: the region handle budget must be at least 1, got ",
              region_handles);
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_configured.load()) {
    TORCH_CHECK(num_devices == g_num_devices && capacity_bytes == g_capacity &&
                    region_handles == g_region_handles && mode == g_mode,
                "spyre: devices are already configured (", g_num_devices, " x ", g_capacity,
                " bytes, ", g_mode, " mode, ", g_region_handles,
                " region handles); they cannot be reconfigured in a running process");
    return;
  }
  g_num_devices = num_devices;
  g_capacity = capacity_bytes;
  g_region_handles = region_handles;
  g_mode = mode;
}

uint64_t region_epoch() {
  return g_region_epoch.load(std::memory_order_acquire);
}

int device_count() {
  ensure_devices();
  return static_cast<int>(g_devices.size());
}

size_t device_capacity() {
  ensure_devices();
  return g_capacity;
}

c10::DataPtr SpyreAllocator::allocate(size_t nbytes) {
  // c10 allocators learn the device from the current device guard.
  c10::DeviceIndex device = 0;
  if (auto impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)) {
    device = impl->getDevice().index();
  }
  return allocate_on(device, nbytes);
}

c10::DataPtr SpyreAllocator::allocate_on(c10::DeviceIndex device, size_t nbytes) {
  auto& mem = memory(device);
  const c10::Device dev(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    return {nullptr, nullptr, &free_block, dev};
  }
  const c10::StreamId stream = current_stream_of(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  mem.reserve_locked(device);
  mem.process_pending_locked();
  Region* region = nullptr;
  size_t length = 0;
  if (nbytes <= mem.capacity) {
    length = round_up(nbytes, kStickBytes);
    region = mem.best_region_locked(length);
    if (region == nullptr) {
      region = mem.new_region_locked(length);
    }
    if (region == nullptr && mem.release_unused_locked() > 0) {
      mem.stats.num_alloc_retries += 1;
      region = mem.new_region_locked(length);
    }
  }
  if (region == nullptr) {
    mem.stats.num_ooms += 1;
    std::ostringstream msg;
    msg << "spyre:" << static_cast<int>(device) << " out of memory (" << mem.mode
        << " mode): tried to allocate " << nbytes << " bytes; "
        << (mem.address_space->free_bytes() + mem.free_in_regions_locked())
        << " bytes free (largest free block in a region " << mem.largest_free_locked()
        << " bytes, " << mem.address_space->free_bytes() << " bytes not yet in a region) of "
        << mem.capacity << "; " << mem.regions.size() << " of " << mem.budget
        << " region handles in use";
    if (mem.pending_bytes > 0) {
      msg << "; " << mem.pending_bytes
          << " bytes are freed but still in use by unfinished streams (synchronize to reclaim them)";
    }
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
  }
  const size_t in_region = *region->blocks.take(length);
  const size_t offset = region->base + in_region;
  region->live += 1;
  mem.live[offset] = {region, length, nbytes, {stream}};
  if (mem.watching) {
    mem.handed_out.emplace_back(region->handle, in_region, length);
  }
  mem.allocated += length;
  mem.count_block_locked(length, nbytes, true);
  void* ptr = mem.base.load() + offset;
  return {ptr, ptr, &free_block, dev};
}

c10::DeleterFnPtr SpyreAllocator::raw_deleter() const {
  return &free_block;
}

void SpyreAllocator::copy_data(void* dest, const void* src, size_t count) const {
  // Device memory is host-addressable in the simulator.
  std::memcpy(dest, src, count);
}

bool SpyreAllocator::initialized() {
  return true;
}

void SpyreAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  ensure_devices();
  for (auto& mem : g_devices) {
    std::lock_guard<std::mutex> lock(mem->mu);
    if (mem->base.load() != nullptr) {
      mem->process_pending_locked();
      mem->release_unused_locked();
    }
  }
}

void SpyreAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get() == nullptr) {
    return;
  }
  auto [mem, offset] = locate(ptr.get());
  TORCH_CHECK(mem != nullptr, "spyre: record_stream on memory that is not spyre device memory");
  std::lock_guard<std::mutex> lock(mem->mu);
  auto it = mem->live.find(offset);
  TORCH_CHECK(it != mem->live.end(), "spyre: record_stream needs the storage's own data pointer");
  auto& streams = it->second.streams;
  if (std::find(streams.begin(), streams.end(), stream.id()) == streams.end()) {
    streams.push_back(stream.id());
  }
}

DeviceStats SpyreAllocator::getDeviceStats(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  mem.process_pending_locked();
  return mem.stats;
}

void SpyreAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  auto& s = mem.stats;
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                    &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
                    &s.requested_bytes}) {
    for (auto& stat : *arr) {
      stat.reset_accumulated();
    }
  }
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
}

void SpyreAllocator::resetPeakStats(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  auto& s = mem.stats;
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                    &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes,
                    &s.requested_bytes}) {
    for (auto& stat : *arr) {
      stat.reset_peak();
    }
  }
}

std::pair<size_t, size_t> SpyreAllocator::getMemoryInfo(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  // As on CUDA: free is what the device has not handed to the allocator
  // (bytes cached in regions count as used until empty_cache()).
  const size_t free = mem.address_space ? mem.address_space->free_bytes() : mem.capacity;
  return {free, mem.capacity};
}

std::optional<c10::DeviceIndex> SpyreAllocator::device_of(const void* ptr) const {
  auto [mem, offset] = locate(ptr);
  if (mem == nullptr) {
    return std::nullopt;
  }
  for (size_t i = 0; i < g_devices.size(); ++i) {
    if (g_devices[i].get() == mem) {
      return static_cast<c10::DeviceIndex>(i);
    }
  }
  return std::nullopt;
}

size_t SpyreAllocator::offset_of(const void* ptr) const {
  auto [mem, offset] = locate(ptr);
  TORCH_CHECK(mem != nullptr, "spyre: pointer ", ptr, " is not in device memory");
  return offset;
}

std::vector<Piece> SpyreAllocator::describe(const void* ptr) const {
  if (ptr == nullptr) {
    return {};  // a zero-byte allocation occupies no device memory
  }
  auto [mem, offset] = locate(ptr);
  TORCH_CHECK(mem != nullptr, "spyre: pointer ", ptr, " is not in spyre device memory");
  std::lock_guard<std::mutex> lock(mem->mu);
  auto it = mem->live.find(offset);
  TORCH_CHECK(it != mem->live.end(), "spyre: no live allocation starts at device offset ", offset);
  const Block& b = it->second;
  return {Piece{b.region->handle, offset - b.region->base, b.length}};
}

RegionInfo SpyreAllocator::region_info(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  const size_t free = mem.free_in_regions_locked();
  const size_t largest = mem.largest_free_locked();
  return RegionInfo{
      mem.mode,
      mem.budget,
      static_cast<int64_t>(mem.regions.size()),
      mem.min_region(),
      free,
      largest,
      free == 0 ? 0.0 : 1.0 - static_cast<double>(largest) / static_cast<double>(free),
  };
}

std::vector<std::tuple<int64_t, size_t, size_t>> SpyreAllocator::regions(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  std::vector<std::tuple<int64_t, size_t, size_t>> out;
  for (const auto& [_, r] : mem.regions) {
    out.emplace_back(r->handle, r->blocks.size(), r->live);
  }
  return out;
}

size_t SpyreAllocator::pending_free_bytes(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  mem.process_pending_locked();
  return mem.pending_bytes;
}

void* SpyreAllocator::region_address(c10::DeviceIndex device, int64_t handle) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  for (const auto& [base, r] : mem.regions) {
    if (r->handle == handle) {
      return mem.base.load() + base;
    }
  }
  TORCH_CHECK(false, "spyre:", static_cast<int>(device), ": no region with handle ", handle);
}

void note_enqueued(c10::DeviceIndex device, c10::StreamId stream, int64_t seq) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  auto& p = mem.progress[stream];
  p.enqueued = std::max(p.enqueued, seq);
}

void note_completed(c10::DeviceIndex device, c10::StreamId stream, int64_t seq) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  auto& p = mem.progress[stream];
  p.completed = std::max(p.completed, seq);
  mem.process_pending_locked();
}

void watch_allocations(c10::DeviceIndex device, bool on) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  mem.watching = on;
  if (!on) {
    mem.handed_out.clear();
  }
}

std::vector<std::tuple<int64_t, size_t, size_t>> take_allocations(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::vector<std::tuple<int64_t, size_t, size_t>> taken;
  std::lock_guard<std::mutex> lock(mem.mu);
  taken.swap(mem.handed_out);
  return taken;
}

SpyreAllocator& device_allocator() {
  static SpyreAllocator instance;
  return instance;
}

namespace {
struct RegisterAllocator {
  RegisterAllocator() {
    c10::SetAllocator(c10::DeviceType::PrivateUse1, &device_allocator());
  }
};
RegisterAllocator g_register_allocator;
}  // namespace

}  // namespace spyre
