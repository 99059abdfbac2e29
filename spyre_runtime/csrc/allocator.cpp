#include "allocator.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace spyre {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

namespace {

// CUDA's split between small and large pools; kept so memory_stats() has the
// same keys with the same meaning.
constexpr size_t kSmallBlockLimit = 1 << 20;

size_t round_to_stick(size_t n) {
  return (n + kStickBytes - 1) / kStickBytes * kStickBytes;
}

// One device's memory: a virtual reservation and a best-fit free list with
// coalescing. All fields are guarded by `mu` except `base`, which is written
// once (under `mu`) and then only read.
struct DeviceMemory {
  std::mutex mu;
  std::atomic<char*> base{nullptr};
  size_t capacity = 0;
  std::map<size_t, size_t> free_by_offset;           // offset -> length
  std::set<std::pair<size_t, size_t>> free_by_size;  // (length, offset)
  struct Live {
    size_t length;
    size_t requested;
  };
  std::unordered_map<size_t, Live> live;  // offset -> block
  DeviceStats stats;
  size_t free_bytes = 0;

  void reserve_locked(c10::DeviceIndex index) {
    if (base.load() != nullptr) {
      return;
    }
    void* p = mmap(
        nullptr,
        capacity,
        PROT_READ | PROT_WRITE,
        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
        -1,
        0);
    TORCH_CHECK(
        p != MAP_FAILED,
        "spyre:",
        static_cast<int>(index),
        ": could not reserve ",
        capacity,
        " bytes of virtual address space for device memory: ",
        std::strerror(errno));
    free_by_offset[0] = capacity;
    free_by_size.insert({capacity, 0});
    free_bytes = capacity;
    base.store(static_cast<char*>(p));
  }

  void add_free_locked(size_t offset, size_t length) {
    auto next = free_by_offset.lower_bound(offset);
    if (next != free_by_offset.end() && next->first == offset + length) {
      length += next->second;
      free_by_size.erase({next->second, next->first});
      next = free_by_offset.erase(next);
    }
    if (next != free_by_offset.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        length += prev->second;
        free_by_size.erase({prev->second, prev->first});
        free_by_offset.erase(prev);
      }
    }
    free_by_offset[offset] = length;
    free_by_size.insert({length, offset});
  }

  size_t largest_free_locked() const {
    return free_by_size.empty() ? 0 : free_by_size.rbegin()->first;
  }
};

std::mutex g_config_mu;
int g_num_devices = 1;
size_t g_capacity = size_t(128) << 30;
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
    g_devices.push_back(std::make_unique<DeviceMemory>());
    g_devices.back()->capacity = g_capacity;
  }
  g_configured.store(true);
}

DeviceMemory& memory(c10::DeviceIndex device) {
  ensure_devices();
  TORCH_CHECK_INDEX(
      device >= 0 && device < static_cast<int>(g_devices.size()),
      "spyre: device index ",
      static_cast<int>(device),
      " is out of range; there are ",
      g_devices.size(),
      " spyre devices (set SPYRE_NUM_DEVICES for more)");
  return *g_devices[device];
}

void update_stats(DeviceStats& s, size_t length, size_t requested, bool add) {
  const auto pool = length <= kSmallBlockLimit ? StatType::SMALL_POOL
                                               : StatType::LARGE_POOL;
  for (auto type : {StatType::AGGREGATE, pool}) {
    const auto i = static_cast<size_t>(type);
    if (add) {
      s.allocation[i].increase(1);
      s.segment[i].increase(1);
      s.active[i].increase(1);
      s.allocated_bytes[i].increase(length);
      s.reserved_bytes[i].increase(length);
      s.active_bytes[i].increase(length);
      s.requested_bytes[i].increase(requested);
    } else {
      s.allocation[i].decrease(1);
      s.segment[i].decrease(1);
      s.active[i].decrease(1);
      s.allocated_bytes[i].decrease(length);
      s.reserved_bytes[i].decrease(length);
      s.active_bytes[i].decrease(length);
      s.requested_bytes[i].decrease(requested);
    }
  }
  if (add) {
    s.num_device_alloc += 1;
  } else {
    s.num_device_free += 1;
  }
}

void free_block(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  auto& alloc = device_allocator();
  auto device = alloc.device_of(ptr);
  TORCH_INTERNAL_ASSERT(device.has_value(), "spyre: freeing a pointer that is not device memory");
  auto& mem = memory(*device);
  const size_t offset = static_cast<char*>(ptr) - mem.base.load();
  std::lock_guard<std::mutex> lock(mem.mu);
  auto it = mem.live.find(offset);
  TORCH_INTERNAL_ASSERT(it != mem.live.end(), "spyre: double free at device offset ", offset);
  const auto block = it->second;
  mem.live.erase(it);
  mem.add_free_locked(offset, block.length);
  mem.free_bytes += block.length;
  update_stats(mem.stats, block.length, block.requested, false);
}

}  // namespace

void configure(int num_devices, size_t capacity_bytes) {
  TORCH_CHECK(num_devices >= 1 && num_devices <= 64,
              "spyre: SPYRE_NUM_DEVICES must be between 1 and 64, got ", num_devices);
  TORCH_CHECK(capacity_bytes >= kStickBytes && capacity_bytes % kStickBytes == 0,
              "spyre: device memory capacity must be a positive multiple of ",
              kStickBytes, " bytes, got ", capacity_bytes);
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (g_configured.load()) {
    TORCH_CHECK(
        num_devices == g_num_devices && capacity_bytes == g_capacity,
        "spyre: devices are already configured (", g_num_devices, " x ",
        g_capacity, " bytes); they cannot be reconfigured in a running process");
    return;
  }
  g_num_devices = num_devices;
  g_capacity = capacity_bytes;
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
  // c10 allocators are told the device through the current device guard.
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
  std::lock_guard<std::mutex> lock(mem.mu);
  mem.reserve_locked(device);
  const size_t length = nbytes > mem.capacity ? 0 : round_to_stick(nbytes);
  auto fit = length == 0 ? mem.free_by_size.end()
                         : mem.free_by_size.lower_bound({length, 0});
  if (fit == mem.free_by_size.end()) {
    mem.stats.num_ooms += 1;
    std::ostringstream msg;
    msg << "spyre:" << static_cast<int>(device) << " out of memory: tried to allocate "
        << nbytes << " bytes; " << mem.free_bytes << " bytes free of "
        << mem.capacity << " (largest free block " << mem.largest_free_locked()
        << " bytes, " << mem.live.size() << " live blocks)";
    TORCH_CHECK_WITH(OutOfMemoryError, false, msg.str());
  }
  const auto [free_len, offset] = *fit;
  mem.free_by_size.erase(fit);
  mem.free_by_offset.erase(offset);
  if (free_len > length) {
    mem.free_by_offset[offset + length] = free_len - length;
    mem.free_by_size.insert({free_len - length, offset + length});
  }
  mem.live[offset] = {length, nbytes};
  mem.free_bytes -= length;
  update_stats(mem.stats, length, nbytes, true);
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
  // Blocks are returned to the free list as soon as they die: nothing is
  // cached above the device memory itself yet.
}

void SpyreAllocator::recordStream(const c10::DataPtr& /*ptr*/, c10::Stream /*stream*/) {
  // Every operation completes before it is enqueued on this synchronous
  // device, so no block can be in use by a stream when it is freed.
}

DeviceStats SpyreAllocator::getDeviceStats(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  return mem.stats;
}

void SpyreAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  auto& s = mem.stats;
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                    &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.inactive_split_bytes, &s.requested_bytes}) {
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
  for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                    &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                    &s.inactive_split_bytes, &s.requested_bytes}) {
    for (auto& stat : *arr) {
      stat.reset_peak();
    }
  }
}

std::pair<size_t, size_t> SpyreAllocator::getMemoryInfo(c10::DeviceIndex device) {
  auto& mem = memory(device);
  std::lock_guard<std::mutex> lock(mem.mu);
  const size_t free = mem.base.load() ? mem.free_bytes : mem.capacity;
  return {free, mem.capacity};
}

std::optional<c10::DeviceIndex> SpyreAllocator::device_of(const void* ptr) const {
  ensure_devices();
  const char* p = static_cast<const char*>(ptr);
  for (size_t i = 0; i < g_devices.size(); ++i) {
    const char* base = g_devices[i]->base.load();
    if (base != nullptr && p >= base && p < base + g_devices[i]->capacity) {
      return static_cast<c10::DeviceIndex>(i);
    }
  }
  return std::nullopt;
}

size_t SpyreAllocator::offset_of(const void* ptr) const {
  auto device = device_of(ptr);
  TORCH_CHECK(device.has_value(), "spyre: pointer ", ptr, " is not in device memory");
  return static_cast<const char*>(ptr) - g_devices[*device]->base.load();
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
