#include "engine/stop_matcher.h"

#include <algorithm>

namespace qs {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops) {
    if (!s.empty()) stops_.push_back(std::move(s));
  }
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return "";
  pending_.append(text);

  // Earliest complete match. None can start in text already emitted: such a match would have
  // made that text a held-back prefix.
  size_t match = std::string::npos;
  for (const std::string& s : stops_) match = std::min(match, pending_.find(s));
  if (match != std::string::npos) {
    std::string out = pending_.substr(0, match);
    pending_.clear();
    stopped_ = true;
    return out;
  }

  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, pending_.size()); len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  pending_.clear();
  return out;
}

}  // namespace qs
