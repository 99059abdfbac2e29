#include "hooks.h"

#include "allocator.h"
#include "guard.h"
#include "runtime_bridge.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace spyre {

namespace {

// Spyre's random numbers come from the same Mersenne Twister as the CPU, so a
// seeded spyre generator reproduces exactly what the CPU fallback draws. It is
// a CPU generator that says it belongs to a spyre device.
class SpyreGenerator final : public at::CPUGeneratorImpl {
 public:
  explicit SpyreGenerator(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val)
      : at::CPUGeneratorImpl(seed) {
    device_ = c10::Device(c10::DeviceType::PrivateUse1, device);
    key_set_ = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);
  }

 private:
  SpyreGenerator* clone_impl() const override {
    auto copy = new SpyreGenerator(device_.index());
    copy->set_engine(const_cast<SpyreGenerator*>(this)->engine());
    copy->set_next_float_normal_sample(const_cast<SpyreGenerator*>(this)->next_float_normal_sample());
    copy->set_next_double_normal_sample(const_cast<SpyreGenerator*>(this)->next_double_normal_sample());
    return copy;
  }
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

}  // namespace spyre
