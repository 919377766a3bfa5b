// Stop strings over streamed text: holds back any tail that could still become a stop string,
// and ends at the first complete match (the stop string and what follows are not emitted).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace qs {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);  // empty strings are ignored

  // Feed the next piece of text; returns the text that is now safe to emit. On a match,
  // returns the text before it and stopped() becomes true; later pushes return "".
  std::string push(std::string_view text);

  // End of generation without a match: returns the held-back tail.
  std::string flush();

  bool stopped() const { return stopped_; }
  const std::string& held() const { return pending_; }  // text not yet emitted

 private:
  std::vector<std::string> stops_;
  std::string pending_;  // text received but not emitted (a possible stop-string prefix)
  bool stopped_ = false;
};

}  // namespace qs
