// Chat-template parser: template source -> AST.
#pragma once

#include <string_view>

#include "model/chat_template_ast.h"

namespace qs::chat_template_internal {

// Scan, lex and parse `source` (TemplateError on a syntax error or an unsupported construct).
NodeList parse_template(std::string_view source);

}  // namespace qs::chat_template_internal
