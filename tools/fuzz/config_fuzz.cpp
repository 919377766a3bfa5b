// libFuzzer target: parse_model_config must return an Error or a config that passes its own
// invariants. Build and run with tools/fuzz/build.sh.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  auto c = qs::parse_model_config(text, "config.json");
  if (!c.ok()) return 0;
  if (c->num_heads <= 0 || c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0 ||
      c->head_dim <= 0 || c->head_dim % 2 != 0 || c->hidden_size <= 0 || c->vocab_size <= 0) {
    std::abort();
  }
  return 0;
}
