// A JSON Schema (OpenAI's response_format json_schema, structured outputs) compiled into the
// grammar JsonRecognizer (json_constraint.h) follows byte by byte: a table of nodes, one per
// kind of value a place in the document may hold, and tries of the literal texts (enum / const
// values, object keys).
//
// The subset (docs in app/server/README.md, "JSON Schema"): type (a name or a list), enum, const,
// anyOf / oneOf (followed as anyOf), allOf of one schema, $ref to "#..." (recursion included),
// $defs / definitions, properties (generated in their order; those not in required may be left
// out), required, additionalProperties (false when properties are given and it is not, as vLLM's
// xgrammar does), propertyNames (an enum's), minProperties, maxProperties, items, prefixItems,
// minItems, maxItems, uniqueItems (of enum / const / boolean / integer items, ascending),
// minLength, maxLength, pattern (json_pattern.h), the string formats of json_formats.h, and on
// numbers and integers minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf.
// Annotations (title, description, default, examples, other formats, ...) and unknown keywords are
// ignored, as JSON Schema says; the assertions this engine cannot enforce (not, if, ...) are errors
// that name them. An empty schema (or true) is any JSON value.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "engine/json_pattern.h"

namespace qs {

// The JSON mode's schema (OpenAI's json_object): one object of any members.
inline constexpr std::string_view kJsonObjectSchema = R"({"type":"object"})";

// A number's bounds are kept in units of 10^-kJsonUnitDigits (kJsonUnit units make 1), exactly:
// JsonScaled. Finite bounds are within +-kJsonMaxBound; kJsonNoBound is beyond all of them.
using JsonScaled = __int128;
inline constexpr int kJsonUnitDigits = 9;
inline constexpr int64_t kJsonUnit = 1'000'000'000;
inline constexpr int64_t kJsonMaxBound = 1'000'000'000'000'000'000;
inline constexpr JsonScaled kJsonNoBound = JsonScaled{kJsonMaxBound} * kJsonUnit * 1000;

// Division of units rounded down / up (b > 0).
inline JsonScaled json_floor_div(JsonScaled a, JsonScaled b) {
  const JsonScaled q = a / b;
  return q * b > a ? q - 1 : q;
}
inline JsonScaled json_ceil_div(JsonScaled a, JsonScaled b) {
  const JsonScaled q = a / b;
  return q * b < a ? q + 1 : q;
}

struct JsonNode {
  enum class Kind : uint8_t {
    kObject,
    kArray,
    kString,
    kNumber,
    kInteger,   // a number without fraction or exponent
    kLiterals,  // one of the texts of a literal trie (enum, const, true / false / null)
    kUnion,     // any of `alternatives` (none of them a union)
  };
  struct Property {
    std::string name;  // as it appears between the quotes (JSON-escaped)
    int32_t value = -1;
    bool required = false;
  };
  Kind kind = Kind::kUnion;
  // kObject: the properties in generation order; `additional`: the node of any other key's value
  // (-1: no other keys); `keys`: the root of the properties' names' trie (-1: no properties);
  // `last_may[i]`: after properties [0, i) the last one that may come next (the first required
  // one from i on, else the last); `last_required`: -1 if none.
  std::vector<Property> properties;
  int32_t additional = -1;
  int32_t keys = -1;
  std::vector<int32_t> last_may;
  int32_t last_required = -1;
  // ... minProperties, maxProperties (-1: no bound); `required_from[i]`: the required properties
  // from i on (properties.size() + 1 entries).
  int32_t min_properties = 0, max_properties = -1;
  std::vector<int32_t> required_from;
  // kArray: item i's node is prefix_items[i] (prefixItems, a tuple's), past them `items` (-1:
  // none)
  std::vector<int32_t> prefix_items;
  int32_t items = -1;
  int32_t min_items = 0, max_items = -1;  // -1: no bound
  // uniqueItems: `items` is a kLiterals node (its values come in the order of their indices, as
  // the enum lists them) or a kInteger one within +-kJsonMaxBound (ascending), no prefix_items:
  // each value at most once, a set written in one order, as an object's properties are.
  bool unique = false;
  // kString: characters (code points; an escape is one); its pattern (JsonGrammar::pattern), -1:
  // none
  int32_t min_length = 0, max_length = -1;
  int32_t pattern = -1;
  int32_t lengths = -1;  // with a pattern and length bounds: JsonGrammar::lengths, else -1
  // kNumber, kInteger: the inclusive bounds in units (kJsonNoBound: none): a value v is within
  // them when minimum <= v * kJsonUnit <= maximum. An integer's are whole numbers (multiples of
  // kJsonUnit); a number's are rounded inwards to units, and a number with bounds is written
  // without an exponent.
  JsonScaled minimum = -kJsonNoBound, maximum = kJsonNoBound;
  // ... and multipleOf in units (0: none; an integer's is also a whole number: the least common
  // multiple with kJsonUnit). A number with one is bounded (within +-kJsonMaxBound unless its
  // bounds are narrower), and its bounds are multiples of it.
  JsonScaled multiple = 0;
  // An integer's values are this far apart, in units.
  JsonScaled integer_step() const { return multiple != 0 ? multiple : kJsonUnit; }
  // kLiterals: the root of its trie
  int32_t trie = -1;
  // kUnion
  std::vector<int32_t> alternatives;
};

// A node of the literal tries: its edges (byte, child) and, where a text ends, its value (the
// property's index in a key trie, the text's index among its node's distinct texts in a value
// trie; -1 elsewhere). `below`: the values in the subtree, ascending (key tries: whether a
// property that may come next is still reachable; value tries: whether a unique array's next item
// is).
struct JsonTrieNode {
  std::vector<std::pair<uint8_t, int32_t>> edges;
  int32_t value = -1;
  std::vector<int32_t> below;
};

class JsonGrammar {
 public:
  // `schema`: the schema's JSON text. Errors name the place (a JSON pointer) and the keyword.
  static Result<JsonGrammar> compile(std::string_view schema);

  int32_t root() const { return root_; }
  const JsonNode& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }
  const JsonTrieNode& trie(int32_t id) const { return tries_[static_cast<size_t>(id)]; }
  const JsonPattern& pattern(int32_t id) const { return patterns_[static_cast<size_t>(id)]; }
  size_t patterns() const { return patterns_.size(); }
  const PatternLengths& lengths(int32_t id) const { return lengths_[static_cast<size_t>(id)]; }
  int32_t child(int32_t trie, uint8_t byte) const;  // -1: none
  // Every byte a literal trie spells (so that the vocabulary can be checked for them).
  std::string literal_bytes() const;
  size_t nodes() const { return nodes_.size(); }

 private:
  friend class JsonSchemaCompiler;
  std::vector<JsonNode> nodes_;
  std::vector<JsonTrieNode> tries_;
  std::vector<JsonPattern> patterns_;
  std::vector<PatternLengths> lengths_;
  int32_t root_ = -1;
};

}  // namespace qs
