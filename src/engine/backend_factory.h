// The backend an engine runs on, chosen by EngineOptions::device.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/config.h"

namespace qs {

// Errors: CUDA asked for in a build without the CUDA backend, no usable CUDA device, or a model
// shape the CUDA kernels do not support (the message names the field).
Result<std::unique_ptr<Backend>> create_backend(const EngineOptions& options,
                                                const ModelConfig& cfg);

}  // namespace qs
