// The JSON Schema "format"s a string's generation follows (as OpenAI's structured outputs and
// vLLM's guided decoding do), each as a pattern automaton (json_pattern.h) of the strings it
// admits: date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid, uri. Each admits
// strings valid for the format's RFC that pydantic's types for it also take (datetime, date,
// time, timedelta, EmailStr, IPv4Address, IPv6Address, UUID, AnyUrl): where the two differ, the
// narrower (e.g. no leap second, no email domain pydantic refuses as special-use). Other formats
// are annotations, as JSON Schema says.
#pragma once

#include <string_view>
#include <vector>

#include "engine/json_pattern.h"

namespace qs {

struct JsonFormat {
  const JsonPattern* pattern = nullptr;  // the strings it admits; nullptr: not followed
  int max_length = -1;                   // in characters, -1: none
};

JsonFormat json_format(std::string_view name);

// The formats followed, by name.
std::vector<std::string_view> json_format_names();

}  // namespace qs
