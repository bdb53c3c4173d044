// Conversions between torch tensors and the wire's TensorData (remote.cpp, remote_expert.cpp).
#pragma once

#include <torch/torch.h>

#include "starling/moe/wire.hpp"

namespace starling::moe {

inline TensorData to_data(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kFloat32).contiguous();
  TensorData d;
  d.shape.assign(c.sizes().begin(), c.sizes().end());
  d.values.assign(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  return d;
}

// A tensor over `d`'s values, which it takes (no copy: large answers are not duplicated).
inline torch::Tensor to_tensor(TensorData&& d) {
  auto owner = new std::vector<float>(std::move(d.values));
  return torch::from_blob(
      owner->data(), d.shape, [owner](void*) { delete owner; },
      torch::TensorOptions().dtype(torch::kFloat32));
}

inline std::string shape_of(const torch::Tensor& t) {
  std::vector<std::int64_t> s(t.sizes().begin(), t.sizes().end());
  return describe_shape(s);
}

}  // namespace starling::moe
