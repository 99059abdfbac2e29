// PrivateUse1 hooks: availability, the per-device random generators and the
// host (pinned) memory allocator PyTorch uses once spyre is the accelerator.
#pragma once

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

namespace spyre {

// The default generator of one device (what torch.spyre.manual_seed seeds).
const at::Generator& default_generator(c10::DeviceIndex device);

}  // namespace spyre
