// The commit the binary was built from (app/cli/git_commit.cmake, refreshed at every build):
// short hash, "-dirty" when tracked files differed from it, "unknown" outside git.
#pragma once

namespace qs::cli {
const char* build_commit();
}  // namespace qs::cli
