// libFuzzer target: SafetensorsFile::parse must return an Error or a file whose every tensor
// lies inside the input. Build and run with tools/fuzz/build.sh.
#include <cstdint>
#include <cstdlib>
#include <span>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = qs::SafetensorsFile::parse(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  if (!f.ok()) return 0;
  volatile unsigned sink = 0;
  for (const qs::TensorInfo& t : f->tensors()) {
    if (t.end > f->data_bytes() || t.begin > t.end) std::abort();
    auto view = f->tensor(t.name);
    if (t.dtype.has_value() != view.ok()) std::abort();
    if (!view.ok()) continue;
    const auto* p = static_cast<const uint8_t*>(view->data);
    for (size_t i = 0; i < view->nbytes; ++i) sink = sink + p[i];
  }
  return 0;
}
