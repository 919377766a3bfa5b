#include <cstdio>
#include <string>

#include "commands.h"

namespace qs::cli {

int report_error(const std::string& message) {
  std::fprintf(stderr, "quantspec: error: %s\n", message.c_str());
  return 1;
}

}  // namespace qs::cli
