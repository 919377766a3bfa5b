// The JSON Schema formats a string follows (json_formats.h): each one's automaton against strings
// its RFC and pydantic take or refuse. tests/server/test_structured.py checks sampled documents
// against pydantic's own types.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/json_formats.h"

namespace qs {
namespace {

struct FormatCase {
  const char* name;
  std::vector<std::string> taken, refused;
};

TEST(JsonFormats, TakeValidStringsAndRefuseInvalidOnes) {
  const std::vector<FormatCase> cases = {
      {"date-time",
       {"2024-01-15T10:30:00Z", "2024-02-29T23:59:59.123456+05:30", "0001-01-01T00:00:00-00:00",
        "2000-02-29T12:00:00.1Z"},
       {"2024-01-15 10:30:00Z", "2024-01-15T10:30:00", "2023-02-29T00:00:00Z",
        "2024-01-15T24:00:00Z", "2024-01-15T23:59:60Z", "2024-01-15t10:30:00z",
        "2024-01-15T10:30:00.Z"}},
      {"date",
       {"2024-12-31", "2000-02-29", "2400-02-29", "1904-02-29", "0004-02-29", "9999-01-01"},
       {"0000-01-01", "1900-02-29", "2023-02-29", "2024-04-31", "2024-13-01", "2024-00-10",
        "2024-1-1", "20240101"}},
      {"time",
       {"00:00:00Z", "23:59:59.999999999+14:00", "12:30:05-08:00"},
       {"12:30", "12:30:05", "24:00:00Z", "12:60:00Z", "12:00:00+24:00", "12:00:00.1234567890Z"}},
      {"duration",
       {"P1D", "PT1H", "PT5M30S", "P1Y2M3DT4H5M6S", "P3W", "P1M", "P1DT2S", "P999999D"},
       {"P", "PT", "P1H", "P1DT", "P1W2D", "1D", "PT1.5S", "P1S", "P1000000D"}},
      {"email",
       {"a@b.co", "first.last+tag@mail.example.org", "x@b.c", "o'neil@x-y.io",
        "a@xn.c0m"},
       {"a@b", "a@b.co1", "a..b@c.de", ".a@c.de", "a@-b.co", "a@b-.co", "a@b.test", "a@x.LOCAL",
        "a@b.onion", "a@b.xn--p1ai", "a@ab--c.io", "a b@c.de", "a@" + std::string(64, 'b') + ".co"}},
      {"hostname",
       {"example.com", "a", "a-b.c-d", "xn--p1ai", "1.2.3.4", std::string(63, 'a')},
       {"-a.com", "a-.com", "a..b", "a.b.", "a_b", std::string(64, 'a'),
        std::string(127, 'a') + "." + std::string(127, 'b')}},  // 255 characters
      {"ipv4",
       {"0.0.0.0", "192.168.1.255", "255.255.255.255", "10.0.0.1"},
       {"256.0.0.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.", " 1.2.3.4"}},
      {"ipv6",
       {"::", "::1", "1::", "2001:db8::1", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "fe80::1:2",
        "ABCD:ef01::"},
       {":", "1:2:3:4:5:6:7:8:9", "1::2::3", "12345::", "1:2:3:4:5:6:7", "g::1", ":1::"}},
      {"uuid",
       {"550e8400-e29b-41d4-a716-446655440000", "00000000-0000-0000-0000-000000000000",
        "ABCDEF01-2345-6789-abcd-ef0123456789"},
       {"550e8400e29b41d4a716446655440000", "550e8400-e29b-41d4-a716-44665544000",
        "{550e8400-e29b-41d4-a716-446655440000}", "550e8400-e29b-41d4-a716-44665544000g"}},
      {"uri",
       {"https://www.example.com/path/to?q=1&r=a%20b#frag", "mailto:a@b.co", "urn:isbn:0451450523",
        "file://localhost/etc/hosts", "ftp://user:pass@host:21/", "a:", "x+y.z-w:/p",
        "http://h:65535"},
       {"http://", "1a:b", "://x", "http://h:65536", "http://h:x/", "a:b c", "a:%zz", "a:b#c#d",
        "http://[::1]/", "no-scheme"}},
  };
  for (const FormatCase& c : cases) {
    const JsonFormat f = json_format(c.name);
    ASSERT_NE(f.pattern, nullptr) << c.name;
    auto fits = [&](const std::string& s) {
      const int chars = static_cast<int>(s.size());  // all ASCII here
      return f.pattern->matches(s) && (f.max_length < 0 || chars <= f.max_length);
    };
    for (const std::string& s : c.taken) EXPECT_TRUE(fits(s)) << c.name << ": '" << s << "'";
    for (const std::string& s : c.refused) EXPECT_FALSE(fits(s)) << c.name << ": '" << s << "'";
  }
}

TEST(JsonFormats, OthersAreAnnotations) {
  EXPECT_EQ(json_format("binary").pattern, nullptr);
  EXPECT_EQ(json_format("password").pattern, nullptr);
  EXPECT_EQ(json_format("Date").pattern, nullptr);  // names are case-sensitive
  EXPECT_EQ(json_format_names().size(), 10u);
}

}  // namespace
}  // namespace qs
