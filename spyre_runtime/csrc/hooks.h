// PrivateUse1 hooks: availability, the per-device random generators and the
// host (pinned) memory allocator PyTorch uses once spyre is the accelerator.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace spyre {

// The default generator of one device (what torch.spyre.manual_seed seeds).
const at::Generator& default_generator(c10::DeviceIndex device);

// Bytes of Philox state (seed, offset) at the head of a spyre generator's state tensor.
constexpr size_t kPhiloxStateBytes = 16;

// (seed, offset) for a random fill of a spyre generator drawing `counters` Philox counters,
// its offset advanced past them under the generator's mutex (one atomic step for threads).
std::pair<uint64_t, uint64_t> philox_reserve(const at::Generator& generator, uint64_t counters);

// Set a spyre generator's Mersenne Twister state (a CPU generator's state tensor), its Philox
// seed and offset kept, under the generator's mutex.
void set_twister_state(const at::Generator& generator, const at::Tensor& twister);

}  // namespace spyre
