// Chat-template renderer: evaluates the AST (expressions, filters, tests, methods, globals).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "model/chat_template_ast.h"

namespace qs::chat_template_internal {

using Scope = std::unordered_map<std::string, Value>;

// Render `nodes` with the variables of `root` (and the built-in globals) into `out`
// (TemplateError on a render error).
void render_template(const NodeList& nodes, std::shared_ptr<Scope> root, std::string& out);

}  // namespace qs::chat_template_internal
