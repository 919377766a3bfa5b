// Chat-template built-in templates (llama2, llama3, mistral, chatml).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace qs::chat_template_internal {

// (name, template source) of each built-in template, in builtin_names() order.
const std::vector<std::pair<std::string, const char*>>& builtin_templates();

}  // namespace qs::chat_template_internal
