#include "engine/json_formats.h"

#include <fmt/format.h>

#include <map>
#include <string>

#include "core/error.h"

namespace qs {

namespace {

struct FormatSpec {
  const char* name;
  std::string regex;                  // anchored
  std::vector<std::string> excluded;  // patterns of strings the format leaves out
  int max_length = -1;
};

// "[Aa][Rr]...": a word in either case.
std::string any_case(std::string_view word) {
  std::string out;
  for (char c : word) {
    const char lower = static_cast<char>(c | 0x20);
    out.push_back('[');
    out.push_back(static_cast<char>(lower & ~0x20));
    out.push_back(lower);
    out.push_back(']');
  }
  return out;
}

// RFC 3339 (JSON Schema's date-time, date, time, duration), years 0001-9999 as Python's; days
// within their month, February 29 in leap years only; no leap second; fractions up to 9 digits;
// 'T' and 'Z' upper case.
std::string full_date() {
  const std::string year = "(?:[0-9]{3}[1-9]|[0-9]{2}[1-9][0-9]|[0-9][1-9][0-9]{2}|[1-9][0-9]{3})";
  const std::string leap_year =
      "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";
  const std::string month_day =
      "(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
      "|02-(?:0[1-9]|1[0-9]|2[0-8]))";
  return "(?:" + year + "-" + month_day + "|" + leap_year + "-02-29)";
}

std::string full_time() {
  const std::string hour = "(?:[01][0-9]|2[0-3])", minute = "[0-5][0-9]";
  return hour + ":" + minute + ":" + minute + "(?:\\.[0-9]{1,9})?(?:Z|[+-]" + hour + ":" + minute +
         ")";
}

// RFC 3339 appendix A; each number up to 6 digits, so that the whole fits Python's timedelta.
std::string duration() {
  const std::string n = "[0-9]{1,6}";
  const std::string time =
      "T(?:" + n + "H(?:" + n + "M(?:" + n + "S)?)?|" + n + "M(?:" + n + "S)?|" + n + "S)";
  const std::string date =
      "(?:" + n + "D|" + n + "M(?:" + n + "D)?|" + n + "Y(?:" + n + "M(?:" + n + "D)?)?)";
  return "P(?:" + date + "(?:" + time + ")?|" + time + "|" + n + "W)";
}

const std::string kLabel = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?";  // RFC 1123

// RFC 5321's dot-atom mailbox at a domain of two or more labels whose last ends in a letter;
// not a label starting "xx--" (IDNA) nor a special-use domain, which pydantic's EmailStr refuses.
FormatSpec email() {
  const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]";
  const std::string tld = "(?:[A-Za-z]|[A-Za-z0-9][A-Za-z0-9-]{0,61}[A-Za-z])";
  std::string special;
  for (const char* word : {"arpa", "invalid", "local", "localhost", "onion", "test"}) {
    if (!special.empty()) special += '|';
    special += any_case(word);
  }
  return {"email",
          "^" + atext + "+(?:\\." + atext + "+)*@(?:" + kLabel + "\\.)+" + tld + "$",
          {"[@.][A-Za-z0-9]{2}--", "\\.(?:" + special + ")$"},
          254};
}

// RFC 3986 with a scheme and, after "//", a host of letters, digits and ._~- ; a port up to
// 65535.
std::string uri() {
  const std::string pct = "%[0-9A-Fa-f]{2}";
  const std::string pchar = "(?:[A-Za-z0-9._~!$&'()*+,;=:@-]|" + pct + ")";
  const std::string userinfo = "(?:[A-Za-z0-9._~!$&'()*+,;=:-]|" + pct + ")*";
  const std::string port =
      "(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])";
  const std::string authority = "(?:" + userinfo + "@)?[A-Za-z0-9._~-]+(?::" + port + ")?";
  const std::string segments = "(?:/" + pchar + "*)*";
  const std::string hier = "(?://" + authority + segments + "|/(?:" + pchar + "+" + segments +
                           ")?|" + pchar + "+" + segments + ")?";
  const std::string tail = "(?:" + pchar + "|[/?])*";
  return "^[A-Za-z][A-Za-z0-9+.-]*:" + hier + "(?:\\?" + tail + ")?(?:#" + tail + ")?$";
}

std::string ipv6() {
  const std::string h = "[0-9a-fA-F]{1,4}";
  const std::string hc = "(?:" + h + ":)", ch = "(?::" + h + ")";
  return "^(?:" + hc + "{7}" + h + "|" + hc + "{1,7}:|" + hc + "{1,6}:" + h + "|" + hc + "{1,5}" +
         ch + "{1,2}|" + hc + "{1,4}" + ch + "{1,3}|" + hc + "{1,3}" + ch + "{1,4}|" + hc + "{1,2}" +
         ch + "{1,5}|" + h + ":" + ch + "{1,6}|:(?:" + ch + "{1,7}|:))$";
}

// The regular expression matching only whole strings of `body`.
std::string whole(const std::string& body) {
  std::string regex = "^";
  regex += body;
  regex += '$';
  return regex;
}

std::vector<FormatSpec> specs() {
  const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
  const std::string hex = "[0-9a-fA-F]";
  return {
      {"date-time", whole(full_date() + "T" + full_time()), {}, -1},
      {"date", whole(full_date()), {}, -1},
      {"time", whole(full_time()), {}, -1},
      {"duration", whole(duration()), {}, -1},
      email(),
      {"hostname", "^" + kLabel + "(?:\\." + kLabel + ")*$", {}, 253},
      {"ipv4", "^(?:" + octet + "\\.){3}" + octet + "$", {}, -1},
      {"ipv6", ipv6(), {}, -1},
      {"uuid", "^" + hex + "{8}-" + hex + "{4}-" + hex + "{4}-" + hex + "{4}-" + hex + "{12}$", {},
       -1},
      {"uri", uri(), {}, -1},
  };
}

struct Compiled {
  JsonPattern pattern;
  int max_length;
};

JsonPattern must(Result<JsonPattern> p, const char* name) {
  if (!p.ok()) QS_CHECK_MSG(false, fmt::format("format {}: {}", name, p.error().message).c_str());
  return std::move(p).value();
}

const std::map<std::string, Compiled, std::less<>>& formats() {
  static const auto* table = [] {
    auto* t = new std::map<std::string, Compiled, std::less<>>;
    for (const FormatSpec& f : specs()) {
      JsonPattern p = must(JsonPattern::compile(f.regex), f.name);
      for (const std::string& out : f.excluded) {
        p = must(JsonPattern::subtract(p, must(JsonPattern::compile(out), f.name)), f.name);
      }
      t->emplace(f.name, Compiled{std::move(p), f.max_length});
    }
    return t;
  }();
  return *table;
}

}  // namespace

JsonFormat json_format(std::string_view name) {
  const auto& table = formats();
  auto it = table.find(name);
  if (it == table.end()) return {};
  return {&it->second.pattern, it->second.max_length};
}

std::vector<std::string_view> json_format_names() {
  std::vector<std::string_view> names;
  for (const auto& [name, f] : formats()) names.push_back(name);
  return names;
}

}  // namespace qs
