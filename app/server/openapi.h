// The OpenAPI 3.1 description of the server (GET /openapi.json). Every constraint it states is
// enforced by api.cpp's validation (which may be stricter), so that a schema-based fuzzer can
// expect a 4xx for anything the document rules out.
#pragma once

#include <cstddef>
#include <string>

#include "api.h"

namespace qs::server {

struct OpenApiLimits {
  std::string model_name;
  int max_context = 0;  // tokens: the largest max_tokens
  int vocab_size = 0;   // token ids are in [0, vocab_size)
  size_t max_body_bytes = 0;
};

Json openapi_document(const OpenApiLimits& limits);

}  // namespace qs::server
