#include "hooks.h"

#include "allocator.h"
#include "guard.h"
#include "runtime_bridge.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/empty.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace spyre {

namespace {

// One generator per spyre device, with two states. Random fills that run in
// spyre programs draw Philox-4x32-10 at (key = the seed, counter = the Philox
// offset + i) and advance the offset by the counters they drew, as CUDA's
// Philox generator does; the ops still on the CPU fallback draw from the CPU's
// Mersenne Twister, so a seeded spyre generator reproduces what the CPU
// fallback draws. Both live here, in the generator object, so that every way
// of seeding or restoring it (manual_seed, seed, set_state, clone; on the
// default generators and on torch.Generator(device="spyre") alike) resets or
// restores both, under the generator's own mutex.
//
// State tensor (uint8): 16 bytes of Philox state (seed and offset,
// little-endian int64, CUDA's layout), then the Mersenne Twister's state.
class SpyreGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit SpyreGenerator(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val)
      : at::CPUGeneratorImpl(seed) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

  // A new seed starts the Philox stream at counter 0, as CUDA's does.
  void set_current_seed(uint64_t seed) override {
    at::CPUGeneratorImpl::set_current_seed(seed);
    philox_offset_ = 0;
  }

  uint64_t seed() override {
    const uint64_t seed = at::CPUGeneratorImpl::seed();
    philox_offset_ = 0;
    return seed;
  }

  void set_offset(uint64_t offset) override {
    philox_offset_ = offset;
  }

  uint64_t get_offset() const override {
    return philox_offset_;
  }

  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    const at::Tensor twister(at::CPUGeneratorImpl::get_state());
    at::Tensor state = at::empty({static_cast<int64_t>(kPhiloxStateBytes) + twister.numel()}, at::kByte);
    auto* bytes = state.data_ptr<uint8_t>();
    const uint64_t philox[2] = {current_seed(), philox_offset_};
    std::memcpy(bytes, philox, kPhiloxStateBytes);
    std::memcpy(bytes + kPhiloxStateBytes, twister.const_data_ptr<uint8_t>(), twister.numel());
    return state.getIntrusivePtr();
  }

  void set_state(const c10::TensorImpl& new_state) override {
    at::detail::check_rng_state(new_state);
    const auto total = static_cast<size_t>(new_state.numel());
    TORCH_CHECK_VALUE(total > kPhiloxStateBytes, "a spyre RNG state has ", kPhiloxStateBytes,
                      " bytes of Philox state (seed, offset) and then the Mersenne Twister's; got ",
                      total, " bytes");
    const auto* bytes = static_cast<const uint8_t*>(new_state.data());
    uint64_t philox[2];
    std::memcpy(philox, bytes, kPhiloxStateBytes);
    at::Tensor twister = at::empty({static_cast<int64_t>(total - kPhiloxStateBytes)}, at::kByte);
    std::memcpy(twister.data_ptr<uint8_t>(), bytes + kPhiloxStateBytes, total - kPhiloxStateBytes);
    // Checked on a probe first, so a refused state leaves this generator as it was.
    at::CPUGeneratorImpl probe;
    probe.set_state(*twister.unsafeGetTensorImpl());
    TORCH_CHECK_VALUE(probe.current_seed() == philox[0],
                      "inconsistent spyre RNG state: its Philox seed ", philox[0],
                      " is not its Mersenne Twister's seed ", probe.current_seed());
    at::CPUGeneratorImpl::set_state(*twister.unsafeGetTensorImpl());
    philox_offset_ = philox[1];
  }

  // The Mersenne Twister's state alone, the Philox offset kept (the caller holds
  // mutex_): what the CPU fallback's random ops drew, written back without undoing
  // a Philox draw another thread made meanwhile.
  void set_twister_locked(const at::Tensor& twister) {
    const uint64_t offset = philox_offset_;
    at::CPUGeneratorImpl::set_state(*twister.unsafeGetTensorImpl());
    philox_offset_ = offset;
  }

  // (seed, offset) for a call drawing `counters` Philox counters, advancing the
  // offset past them (the caller holds mutex_).
  std::pair<uint64_t, uint64_t> reserve_locked(uint64_t counters) {
    const uint64_t offset = philox_offset_;
    philox_offset_ += counters;
    return {current_seed(), offset};
  }

 private:
  SpyreGenerator* clone_impl() const override {
    auto copy = new SpyreGenerator(device_.index());
    copy->set_engine(const_cast<SpyreGenerator*>(this)->engine());
    copy->set_next_float_normal_sample(const_cast<SpyreGenerator*>(this)->next_float_normal_sample());
    copy->set_next_double_normal_sample(const_cast<SpyreGenerator*>(this)->next_double_normal_sample());
    copy->philox_offset_ = philox_offset_;
    return copy;
  }

  uint64_t philox_offset_ = 0;
};

std::once_flag g_generators_once;
std::vector<at::Generator> g_generators;

// Host memory that spyre transfers may use directly ("pinned"). The simulated
// device reads host memory anyway; what matters is that PyTorch can tell these
// blocks apart (is_pinned) and that pin_memory() works once spyre is the
// accelerator.
class PinnedHostAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nullptr;
    if (nbytes > 0) {
      const int rc = posix_memalign(&ptr, kStickBytes, nbytes);
      TORCH_CHECK_WITH(OutOfMemoryError, rc == 0,
                       "spyre: could not allocate ", nbytes, " bytes of pinned host memory");
      std::lock_guard<std::mutex> lock(mu_);
      blocks_[static_cast<char*>(ptr)] = nbytes;
    }
    return {ptr, ptr, &release, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

  void copy_data(void* dest, const void* src, size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool contains(const void* ptr) {
    const char* p = static_cast<const char*>(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.upper_bound(const_cast<char*>(p));
    if (it == blocks_.begin()) {
      return false;
    }
    --it;
    return p < it->first + it->second;
  }

  static void release(void* ptr);

 private:
  std::mutex mu_;
  std::map<char*, size_t> blocks_;
};

PinnedHostAllocator& pinned_allocator() {
  static PinnedHostAllocator instance;
  return instance;
}

void PinnedHostAllocator::release(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  auto& self = pinned_allocator();
  {
    std::lock_guard<std::mutex> lock(self.mu_);
    self.blocks_.erase(static_cast<char*>(ptr));
  }
  std::free(ptr);
}

struct SpyreHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }

  bool isAvailable() const override {
    return device_count() > 0;
  }

  bool hasPrimaryContext(c10::DeviceIndex /*device*/) const override {
    return true;
  }

  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(device_count());
  }

  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_current_device(device);
  }

  c10::DeviceIndex getCurrentDevice() const override {
    return current_device();
  }

  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const auto old = current_device();
    set_current_device(device);
    return old;
  }

  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex device) const override {
    return default_generator(device);
  }

  at::Generator getNewGenerator(c10::DeviceIndex device) const override {
    const auto index = device < 0 ? current_device() : device;
    return at::make_generator<SpyreGenerator>(index);
  }

  at::Device getDeviceFromPtr(void* data) const override {
    auto device = device_allocator().device_of(data);
    TORCH_CHECK(device.has_value(), "spyre: pointer ", data, " is not in spyre device memory");
    return {c10::DeviceType::PrivateUse1, *device};
  }

  bool isPinnedPtr(const void* data) const override {
    return pinned_allocator().contains(data);
  }

  at::Allocator* getPinnedMemoryAllocator() const override {
    return &pinned_allocator();
  }

  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "spyre: trying to resize a storage that is not resizable");
    const auto device = storage.device().index();
    // The old bytes are copied on the host: queued work writing them must finish.
    bridge::device_synchronize(device);
    auto fresh = device_allocator().allocate_on(device, newsize);
    const size_t keep = std::min(newsize, impl->nbytes());
    if (keep > 0) {
      std::memcpy(fresh.get(), impl->data(), keep);
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct RegisterHooks {
  RegisterHooks() {
    at::RegisterPrivateUse1HooksInterface(new SpyreHooks());
  }
};
RegisterHooks g_register_hooks;

}  // namespace

const at::Generator& default_generator(c10::DeviceIndex device) {
  std::call_once(g_generators_once, [] {
    for (int i = 0; i < device_count(); ++i) {
      g_generators.push_back(at::make_generator<SpyreGenerator>(static_cast<c10::DeviceIndex>(i)));
    }
  });
  const auto index = device < 0 ? current_device() : device;
  TORCH_CHECK_INDEX(index >= 0 && index < static_cast<int>(g_generators.size()),
                    "spyre: no generator for device index ", static_cast<int>(index),
                    "; there are ", g_generators.size(), " spyre devices");
  return g_generators[index];
}

namespace {

SpyreGenerator* spyre_generator(const at::Generator& generator, const char* what) {
  auto* impl = dynamic_cast<SpyreGenerator*>(generator.unsafeGetGeneratorImpl());
  TORCH_CHECK_VALUE(impl != nullptr, what, ": expected a spyre generator, got one of ", generator.device());
  return impl;
}

}  // namespace

std::pair<uint64_t, uint64_t> philox_reserve(const at::Generator& generator, uint64_t counters) {
  auto* impl = spyre_generator(generator, "philox_reserve");
  std::lock_guard<std::mutex> lock(impl->mutex_);
  return impl->reserve_locked(counters);
}

void set_twister_state(const at::Generator& generator, const at::Tensor& twister) {
  auto* impl = spyre_generator(generator, "set_twister_state");
  std::lock_guard<std::mutex> lock(impl->mutex_);
  impl->set_twister_locked(twister);
}

}  // namespace spyre
