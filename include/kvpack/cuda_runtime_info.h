// GPU presence queries usable from host code in any build (returns 0 / "" when CUDA is absent or no device).
#pragma once
#include <string>

namespace kvpack::cuda {
int device_count();             // 0 when built without CUDA, or no usable GPU
std::string device_name(int device = 0);
}  // namespace kvpack::cuda
