// Constrained JSON: JSON mode's recognizer takes exactly the prefixes of one JSON object (checked
// byte by byte and against nlohmann's parser); a JSON Schema's grammar takes its documents and
// refuses the rest at the first impossible byte, and every document a random walk through it
// finishes is one the schema accepts (tests' own tree-based check); JsonConstraint's trie walk
// allows exactly the tokens whose bytes the state takes (against a token-by-token check over real
// vocabularies), and Tokenizer::token_bytes spells each token's bytes.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "json_schema_check.h"
#include "model/tokenizer/tokenizer.h"

#ifndef QS_SOURCE_DIR
#error "QS_SOURCE_DIR must be defined"
#endif

namespace qs {
namespace {

// Whether all of `text` is taken, and then whether it is complete.
struct Verdict {
  size_t taken = 0;  // bytes taken before the first refused one
  bool complete = false;
};

JsonRecognizer recognizer(std::string_view schema) {
  auto g = JsonGrammar::compile(schema);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return JsonRecognizer(std::move(g).value());
}

// JSON mode's (one for the tests that share it).
JsonRecognizer& object_mode() {
  static JsonRecognizer rec = recognizer(kJsonObjectSchema);
  return rec;
}

Verdict run(JsonRecognizer& rec, std::string_view text) {
  JsonState s = rec.start();
  Verdict v;
  for (char c : text) {
    if (!rec.advance(s, static_cast<uint8_t>(c))) return v;
    ++v.taken;
  }
  v.complete = rec.finished(s);
  return v;
}

Verdict run(std::string_view text) {
  return run(object_mode(), text);
}

const std::vector<std::string> kValid = {
    "{}",
    " \n{ }",
    "{\"a\":1}",
    "{\"a\": -0.5e+10, \"b\": [true, false, null, 0, 12, 3.25, -1E-2], \"c\": {}}",
    "{\"k\": \"esc \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\u00e9 \\uABCD\"}",
    "{\"utf8\": \"\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xed\x9f\xbf \xe0\xa0\x80\"}",
    "{\"nested\": [[[]], [{}], {\"x\": [1, {\"y\": \"z\"}]}]}",
    "{\r\n  \"pretty\": [\r\n    1,\r\n    2\r\n  ]\r\n}",
};

TEST(JsonState, TakesWholeObjectsAndCompletesOnlyAtTheirEnd) {
  JsonRecognizer& rec = object_mode();
  for (const std::string& doc : kValid) {
    JsonState s = rec.start();
    for (size_t i = 0; i < doc.size(); ++i) {
      ASSERT_FALSE(rec.accepting(s)) << doc << " complete after " << i << " bytes";
      ASSERT_TRUE(rec.advance(s, static_cast<uint8_t>(doc[i]))) << doc << " refused byte " << i;
    }
    EXPECT_TRUE(rec.finished(s)) << doc;
    EXPECT_TRUE(nlohmann::json::accept(doc)) << doc;
  }
}

TEST(JsonState, RefusesAtTheFirstImpossibleByte) {
  struct Case {
    std::string text;
    size_t taken;
  };
  const std::vector<Case> cases = {
      {"[]", 0},                            // the top level is an object
      {"\"s\"", 0},                         //
      {"{a", 1},                            // keys are strings
      {"{\"a\" 1}", 5},                     // a colon after a key
      {"{\"a\":01}", 6},                    // no leading zeros
      {"{\"a\":1.}", 7},                    // a fraction has digits
      {"{\"a\":1e}", 7},                    //
      {"{\"a\":-}", 6},                     //
      {"{\"a\":tru}", 8},                   //
      {"{\"a\":nul1}", 8},                  //
      {"{\"a\":\"\x01\"}", 6},              // control characters are escaped
      {"{\"a\":\"\\x\"}", 7},               // an unknown escape
      {"{\"a\":\"\\u12G4\"}", 10},          // four hex digits
      {"{\"a\":\"\xc0\x80\"}", 6},          // an overlong lead byte
      {"{\"a\":\"\xe0\x80\x80\"}", 7},      // an overlong three-byte form
      {"{\"a\":\"\xed\xa0\x80\"}", 7},      // a surrogate
      {"{\"a\":\"\xf4\x90\x80\x80\"}", 7},  // past U+10FFFF
      {"{\"a\":\"\xf5\"}", 6},              //
      {"{\"a\":\"\xc3\"}", 7},              // a sequence cut short
      {"{}}", 2},                           // nothing after the object
      {"{} ", 2},                           // not even whitespace
      {"{\"a\":[1,]}", 8},                  // no trailing comma
      {"{,}", 1},                           //
      {"{\"a\":[}", 6},                     // closers match their openers
      {"{\"a\":{]", 6},                     //
      {"{\"a\":1,}", 7},                    //
  };
  for (const Case& c : cases) {
    const Verdict v = run(c.text);
    EXPECT_EQ(v.taken, c.taken) << c.text;
    EXPECT_FALSE(v.complete) << c.text;
  }
}

TEST(JsonState, BoundsWhitespaceRunsAndNesting) {
  const std::string ws(kJsonMaxWhitespace, ' ');
  EXPECT_TRUE(run("{" + ws + "}").complete);
  EXPECT_EQ(run("{" + ws + " }").taken, 1u + kJsonMaxWhitespace);
  EXPECT_TRUE(run("{" + ws + "\"a\"" + ws + ":" + ws + "1" + ws + "}").complete);  // per run
  // The object itself is depth 1: kJsonMaxDepth - 1 arrays fit inside it, one more does not.
  const int arrays = kJsonMaxDepth - 1;
  const std::string deep = "{\"a\":" + std::string(arrays, '[') + std::string(arrays, ']') + "}";
  EXPECT_TRUE(run(deep).complete);
  EXPECT_EQ(run("{\"a\":" + std::string(arrays + 1, '[')).taken, 5u + arrays);
}

// Against nlohmann's parser on mutations of the valid documents: a whole text is complete exactly
// when it is one JSON object (texts outside the two bounds, with trailing whitespace, or with
// \u escapes, whose surrogate pairing nlohmann checks and the grammar does not, are skipped).
TEST(JsonState, AgreesWithAParserOnMutatedDocuments) {
  std::mt19937 rng(5);
  const std::string alphabet = "{}[]\":,-+.0123456789eEtrufalsn\\ \n\xc3\xa9\x80\x01ax";
  int checked = 0, objects = 0;
  for (int trial = 0; trial < 20000; ++trial) {
    std::string t = kValid[rng() % kValid.size()];
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      const size_t at = rng() % t.size();
      const char c = alphabet[rng() % alphabet.size()];
      switch (rng() % 3) {
        case 0:
          t[at] = c;
          break;
        case 1:
          t.insert(t.begin() + static_cast<std::ptrdiff_t>(at), c);
          break;
        default:
          t.erase(at, 1);
          break;
      }
    }
    if (t.empty() || t.find("\\u") != std::string::npos) continue;
    const char last = t.back();
    if (last == ' ' || last == '\n' || last == '\r' || last == '\t') continue;
    bool parser = false;
    try {
      parser = nlohmann::json::parse(t).is_object();
    } catch (const nlohmann::json::out_of_range&) {
      continue;  // a number past a double's range: JSON's grammar has no bound
    } catch (const nlohmann::json::exception&) {
    }
    EXPECT_EQ(run(t).complete, parser) << nlohmann::json(t).dump(-1, ' ', true);
    ++checked;
    objects += parser;
  }
  EXPECT_GT(checked, 15000);
  EXPECT_GT(objects, 500);  // both verdicts are common
}

// Every byte prefix of the documents: the states a generation meets.
std::vector<JsonState> states_of(JsonRecognizer& rec, const std::vector<std::string>& docs) {
  std::vector<JsonState> out;
  for (const std::string& doc : docs) {
    JsonState s = rec.start();
    out.push_back(s);
    for (char c : doc) {
      EXPECT_TRUE(rec.advance(s, static_cast<uint8_t>(c))) << doc;
      out.push_back(s);
    }
  }
  return out;
}

class JsonTokens : public ::testing::TestWithParam<const char*> {
 protected:
  Tokenizer tokenizer = [] {
    auto t =
        Tokenizer::load(std::filesystem::path(QS_SOURCE_DIR) / "models/tokenizers" / GetParam());
    EXPECT_TRUE(t.ok()) << t.error().message;
    return std::move(t).value();
  }();
};

TEST_P(JsonTokens, TokenBytesSpellTheText) {
  const std::string text =
      "{\"k\": [1, -2.5e3], \"s\": \"caf\xc3\xa9 \xe2\x82\xac\xf0\x9f\x98\x80\"}";
  const std::vector<int32_t> ids = tokenizer.encode(text, false);
  std::string joined;
  for (int32_t id : ids) joined += tokenizer.token_bytes(id);
  // A SentencePiece-style vocabulary spells the text with its prefix space.
  EXPECT_TRUE(joined == text || joined == " " + text) << joined;
}

// Schemas and documents they accept: each schema's documents, then what they are written in.
struct SchemaCase {
  const char* name;
  std::string schema;
  std::vector<std::string> valid;
  // (text, the part it is refused at: the bytes before its first occurrence are taken)
  std::vector<std::pair<std::string, std::string>> refused;
};

const std::vector<SchemaCase>& schema_cases() {
  static const std::vector<SchemaCase> cases = {
      {"person",
       R"({"type": "object", "properties": {
             "name": {"type": "string", "minLength": 1, "maxLength": 5},
             "age": {"type": "integer", "description": "years"},
             "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 2},
             "ok": {"type": "boolean"}},
           "required": ["name", "age"], "title": "Person"})",
       {R"({"name":"Al","age":30})",
        R"({ "name" : "Bob" , "age" : -1 , "tags" : ["a","bc"], "ok": true })",
        "{\"name\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\",\"age\":0,\"ok\":false}",
        R"({"name":"a\"\u00e9","age":1,"tags":[]})"},
       {{R"({"age":30})", "age"},                                      // name comes first
        {R"({"name":"","age":1})", "\",\"age"},                        // minLength
        {R"({"name":"abcdef","age":1})", "f\""},                       // maxLength
        {R"({"name":"a","age":1.5})", ".5"},                           // an integer
        {R"({"name":"a","age":1,"tags":["a","bc","a"]})", ",\"a\"]"},  // maxItems
        {R"({"name":"a","age":1,"tags":["b"]})", "\"]"},               // enum ("b" starts "bc")
        {R"({"name":"a","age":1,"x":1})", "x\""},                      // no other keys
        {R"({"name":"a","name":"b","age":1})", "name\":\"b"},          // each key once
        {R"({"name":"a","age":1,"ok":tru})", "}"},                     //
        {R"({"name":"a"})", "}"}}},                                    // age is required
      {"tree or list",
       R"({"$defs": {"node": {"type": "object", "properties": {
             "v": {"type": ["integer", "null"]},
             "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
           "required": ["v"]}},
           "anyOf": [{"$ref": "#/$defs/node"},
                     {"type": "object", "properties": {"v": {"type": "string"}}, "required": ["v"]},
                     {"type": "array", "items": {"type": "number"}, "minItems": 1}]})",
       {R"({"v":1,"kids":[{"v":null},{"v":2,"kids":[{"v":3}]}]})", R"({"v":"s"})",
        R"([1.5, -2e3, 0])"},
       {{R"({"v":true})", "true"},
        {"[]", "]"},
        {R"({"v":"s","kids":[]})", ",\"kids"},
        {R"({"v":1,"kids":[{"kids":[]}]})", "kids\":[]}]"}}},
      {"other keys",
       R"({"type": "object", "properties": {"id": {"type": "integer"}},
           "additionalProperties": {"type": "string"}})",
       {R"({"id":1,"x":"y"})", R"({"x":"y","id":2,"z":""})", "{}"},
       {{R"({"id":1,"id":2})", "\":2}"}, {R"({"x":1})", "1}"}, {R"({"i\u0064":"s"})", "\\u"}}},
      {"literals",
       R"({"enum": ["red", "green", 1, 12, [1, 2], {"a": null}]})",
       {R"("red")", "1", "12", "[1,2]", R"({"a":null})"},
       {{"[1, 2]", " 2"}, {R"("blue")", "blue"}, {"13", "3"}, {R"("red" )", " "}}},
      {"integer", R"({"type": "integer"})", {"12", "-0", "7"}, {{"1.0", ".0"}, {"01", "1"}}},
      {"integer bounds",
       R"({"type": "object", "properties": {
             "age": {"type": "integer", "minimum": 18, "exclusiveMaximum": 130},
             "delta": {"type": "integer", "minimum": -5, "maximum": -2},
             "big": {"type": "integer", "exclusiveMinimum": 999.5}},
           "required": ["age", "delta"]})",
       {R"({"age":18,"delta":-5})", R"({"age":129,"delta":-2,"big":1000})",
        R"({"age": 42, "delta": -3, "big": 123456789012345678901234567890})"},
       {{R"({"age":17,"delta":-3})", "7,"},       // 17, and 170.. are out
        {R"({"age":130,"delta":-3})", "30"},      // 13 cannot reach 18..129
        {R"({"age":5,"delta":-3})", ",\"delta"},  // 5 may grow to 50: it ends out of range
        {R"({"age":018,"delta":-3})", "018"},     // a leading 0 is 0
        {R"({"age":18,"delta":-1})", "1}"},       //
        {R"({"age":18,"delta":2})", "2}"},        //
        {R"({"age":18,"delta":-0})", "0}"},       // -0 is 0
        {R"({"age":18,"delta":-3,"big":999})", "}"}}},
      {"top-level bounds",
       R"({"type": "integer", "minimum": -3, "maximum": 250})",
       {"-3", "0", "-0", "250", "25", "9"},
       {{"-4", "4"}, {"251", "1"}, {"2509", "9"}}},
      {"number bounds",
       R"({"type": "object", "properties": {
             "p": {"type": "number", "minimum": 0, "maximum": 1},
             "t": {"type": "number", "exclusiveMinimum": -0.5, "exclusiveMaximum": 2.25},
             "lat": {"minimum": -90, "maximum": 90},
             "tiny": {"type": "number", "minimum": 1e-9, "maximum": 0.000000002}},
           "required": ["p"]})",
       {R"({"p":0})", R"({"p":1,"t":-0.4999,"lat":-90})",
        R"({"p":0.25,"t":2.249999999,"lat":89.999})", R"({"p":1.000,"lat":-0})",
        R"({"p":-0.0,"tiny":0.000000001})", R"({"p":0.3333333333333333,"tiny":0.0000000015})",
        R"({"p":0.5,"tiny":0.000000002000})"},
       {{R"({"p":-0.5})", "5}"},                     // "-0." may still be -0.0
        {R"({"p":1.5})", "5}"},                      //
        {R"({"p":2})", "2}"},                        // 2, 20.., 200.. are all out
        {R"({"p":0.5e1})", "e1"},                    // no exponent where bounds are
        {R"({"p":1,"t":-0.5})", "5}"},               // exclusive
        {R"({"p":1,"t":2.25})", "5}"},               //
        {R"({"p":1,"t":2.2499999999})", "9}"},       // past 9 fraction digits: below 2.25 by
                                                     // less than 10^-9, not followed
        {R"({"p":1,"lat":90.5})", "5}"},             //
        {R"({"p":0,"lat":"x"})", "\"x"},             // a number (bounds imply it)
        {R"({"p":0,"tiny":0.0000000025})", "5}"}}},  // 2e-9 and more: out
      {"long bounded string",  // past minLength and with room for any token: one mask
       R"({"type": "object", "properties": {"s": {"type": "string", "minLength": 3,
           "maxLength": 60}}, "required": ["s"]})",
       {R"({"s":"abc"})", R"({"s":"The Lord said unto Moses, \u00e9 \"quoted\" caf\u00e9 \n ok"})",
        "{\"s\":\"" + std::string(60, 'x') + "\"}"},
       {{R"({"s":"ab"})", "\"}"}, {"{\"s\":\"" + std::string(60, 'y') + "z\"}", "z"}}},
      {"patterns",
       R"({"type": "object", "properties": {
             "zip": {"type": "string", "pattern": "^\\d{5}(-\\d{4})?$"},
             "code": {"pattern": "^[A-Z]{2}[0-9]+$"},
             "note": {"type": "string", "pattern": "ok"},
             "q": {"type": "string", "pattern": "^a\"b\\\\c\\n$"},
             "kind": {"enum": ["ab", "xy", "abc"], "pattern": "^a"}},
           "required": ["zip"]})",
       {R"({"zip":"12345"})", R"({"zip":"12345-6789","code":"AB12","note":"is ok here"})",
        R"({"zip":"00000","q":"a\"b\\c\n"})", R"({"zip":"11111","kind":"abc"})",
        "{\"zip\":\"11111\",\"note\":\"\xc3\xa9ok\xe6\x97\xa5\"}"},
       {{R"({"zip":"1234"})", "\"}"},                   // too short
        {R"({"zip":"123456"})", "6\""},                 //
        {R"({"zip":"12345-"})", "\"}"},                 // a half suffix
        {R"({"zip":"1a"})", "a\""},                     //
        {R"({"zip":"12345","code":"A1"})", "1\"}"},     //
        {R"({"zip":"12345","code":"ab"})", "ab\""},     //
        {R"({"zip":"12345","note":"no"})", "\"}"},      // "ok" is not in it (yet)
        {R"({"zip":"12345","kind":"xy"})", "xy"},       // an enum value it does not match
        {R"({"zip":"\u0031"})", "\\u0031"},             // no escape's character is a digit
        {R"({"zip":"12345","q":"a\u0022)", "u0022"}}},  // no \u where a pattern reads
      {"patterns with lengths",  // both followed together: no string they leave unfinishable
       R"({"type": "object", "properties": {
             "id": {"type": "string", "pattern": "^[a-z]+\\d*$", "minLength": 3, "maxLength": 5},
             "tag": {"type": "string", "pattern": "^(ab)+$", "maxLength": 5},
             "w": {"type": "string", "pattern": "x", "minLength": 4}},
           "required": ["id"]})",
       {R"({"id":"abc"})", R"({"id":"ab12"})", R"({"id":"a1234","tag":"abab"})",
        R"({"id":"xyz","w":"aaax"})", R"({"id":"xyz","w":"xaaaaaaa"})"},
       {{R"({"id":"ab"})", "\"}"},                  // minLength
        {R"({"id":"abcdef"})", "f\""},              // maxLength
        {R"({"id":"a12345"})", "5\""},              //
        {R"({"id":"abc","tag":"ababa"})", "a\"}"},  // a 6th character would be due
        {R"({"id":"abc","w":"axa"})", "\"}"}}},     // "x" is in it, but 3 < 4
      {"formats",  // json_formats.h: alone, beside a pattern, an enum, length bounds, no type
       R"({"type": "object", "properties": {
             "when": {"type": "string", "format": "date-time"},
             "day": {"type": "string", "format": "date"},
             "mail": {"type": "string", "format": "email"},
             "ip": {"type": "string", "format": "ipv4"},
             "id": {"format": "uuid", "type": "string"},
             "site": {"type": "string", "format": "uri", "minLength": 1, "maxLength": 40},
             "code": {"type": "string", "format": "date", "pattern": "^2024-"},
             "any": {"format": "date"},
             "kind": {"enum": ["2024-01-01", "yesterday"], "format": "date"},
             "pic": {"type": "string", "format": "binary"}}})",
       {R"({"when":"2024-01-15T10:30:00Z","day":"2000-02-29","mail":"a.b@c.io","ip":"10.0.0.1"})",
        R"({"id":"550e8400-e29b-41d4-a716-446655440000","site":"https://example.com/a?b=1"})",
        R"({"code":"2024-03-01","any":5,"kind":"2024-01-01","pic":"anything"})",
        R"({"when":"2024-02-29T23:59:59.5+05:30","any":"2024-01-01"})"},
       {{R"({"day":"2023-02-29"})", "9\"}"},   // not a leap year
        {R"({"mail":"a@b.test"})", "\"}"},     // pydantic refuses .test
        {R"({"ip":"256.1.1.1"})", "6.1"},      //
        {R"({"code":"2023-01-01"})", "3-01"},  // the pattern
        {R"({"any":"yesterday"})", "yes"},     //
        {R"({"kind":"yesterday"})", "yes"},    // not a date: not offered
        {R"({"site":"http://"})", "\"}"},      // no host
        {R"({"site":"https://example.com/abcdefghijklmnopqrstuvwxyz"})", "uvw"},  // 40
        {R"({"when":"2024-01-15T10:30:00"})", "\"}"}}},                           // no offset
      {"tuples",  // prefixItems (pydantic's tuple[int, str]), with items past them or not
       R"({"type": "object", "properties": {
             "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                      "minItems": 2, "maxItems": 2},
             "head": {"type": "array", "prefixItems": [{"const": "x"}], "items": {"type": "integer"}},
             "closed": {"prefixItems": [{"type": "boolean"}, {"type": "null"}], "items": false},
             "rest": {"type": "array", "prefixItems": [{"type": "integer"}]}}})",
       {R"({"pair":[1,"a"],"head":["x",1,2,3],"closed":[true]})",
        R"({"head":[],"closed":[false,null],"rest":[1,"any",{}]})", R"({"rest":[]})"},
       {{R"({"pair":["a",1]})", "\"a\","},      // item 0 is an integer
        {R"({"pair":[1]})", "]}"},              // minItems
        {R"({"pair":[1,"a",2]})", ",2"},        // maxItems
        {R"({"head":["y"]})", "y"},             //
        {R"({"head":["x","z"]})", "\"z"},       // past the prefix: integers
        {R"({"closed":[true,null,1]})", ",1"},  // items: false
        {R"({"closed":[null]})", "null"}}},     //
      {"multiples",  // multipleOf: alone (within 1e18), beside bounds, on integers, in an enum
       R"({"type": "object", "properties": {
             "n": {"type": "integer", "multipleOf": 5},
             "price": {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 100},
             "q": {"type": "number", "multipleOf": 0.25, "exclusiveMinimum": -1},
             "h": {"type": "integer", "multipleOf": 1.5, "maximum": 10},
             "e": {"enum": [1, 2.5, 3, 7, "x"], "multipleOf": 1.5},
             "any": {"multipleOf": 2}}})",
       {R"({"n":0,"price":19.99,"q":-0.75,"h":-3})", R"({"n":-15,"price":100,"q":2.5,"h":9})",
        R"({"n":1000000000000000000,"price":0.10,"q":12.250,"h":0,"e":3})",
        R"({"price":1.000000000,"q":0,"e":"x","any":-4})", R"({"price":-0.0,"any":0.0})"},
       {{R"({"n":12})", "}"},                       // 12 may become 120 or 125
        {R"({"n":5.0})", ".0"},                     // an integer
        {R"({"price":19.999})", "9}"},              // 19.999..: no multiple of 0.01
        {R"({"price":1.0000000001})", "1}"},        // past 9 fraction digits: not a multiple
        {R"({"price":-0.01})", "1}"},               // -0.0.. is 0
        {R"({"price":100.5})", "5}"},               //
        {R"({"q":-1})", "1}"},                      // exclusive
        {R"({"q":0.3})", "3}"},                     //
        {R"({"q":2.5e1})", "e1"},                   // no exponent
        {R"({"h":4})", "4}"},                       // multiples of 3 up to 9
        {R"({"h":12})", "12}"},                     //
        {R"({"e":1})", "1}"},                       //
        {R"({"any":3})", "}"},                      // 3 may become 30
        {R"({"any":"2"})", "\"2"},                  // a number (multipleOf implies it)
        {R"({"n":10000000000000000000})", "0}"}}},  // past 1e18
      {"unique items",  // uniqueItems of enum / boolean / $ref items: in their order, each once
       R"({"type": "object", "properties": {
             "colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                        "uniqueItems": true},
             "flags": {"type": "array", "items": {"type": "boolean"}, "uniqueItems": true,
                       "minItems": 2},
             "refs": {"type": "array", "items": {"$ref": "#/$defs/c"}, "uniqueItems": true,
                      "maxItems": 2},
             "two": {"type": "array", "items": {"enum": ["a", "b", "c", "a"]}, "uniqueItems": true,
                     "minItems": 2},
             "loose": {"type": "array", "items": {"type": "integer"}, "uniqueItems": false},
             "ids": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 3},
                     "uniqueItems": true, "minItems": 2},
             "tens": {"type": "array", "items": {"type": "integer", "multipleOf": 10},
                      "uniqueItems": true}},
           "$defs": {"c": {"enum": [1, 2, "a"]}}})",
       {R"({"colors":["red","blue"],"flags":[true,false]})",
        R"({"colors":[],"flags":[true,false],"refs":[1,"a"]})",
        R"({"colors":["green"],"two":["a","c"],"loose":[1,1]})",
        R"({"colors":["red","green","blue"],"refs":[2],"two":["b","c"]})",
        R"({"ids":[0,3],"tens":[-20,0,1000]})", R"({"ids":[1,2,3],"tens":[]})",
        R"({"ids":[0,1,2,3],"tens":[-1000000000000000000,1000000000000000000]})"},
       {{R"({"colors":["blue","red"]})", ",\"red"},       // blue is the last value
        {R"({"colors":["red","red"]})", "red\"]"},        // each once
        {R"({"flags":[false,true]})", "false"},           // true comes first, and two are due
        {R"({"flags":[true]})", "]}"},                    // minItems
        {R"({"refs":[2,1]})", "1]"},                      //
        {R"({"refs":[1,2,"a"]})", ",\"a"},                // maxItems
        {R"({"two":["c"]})", "c\"]"},                     // "c" leaves nothing for a second item
        {R"({"ids":[2,1]})", "1]"},                       // ascending
        {R"({"ids":[1,1]})", "1]"},                       // each once
        {R"({"ids":[3]})", "3]"},                         // 3 leaves nothing for a second item
        {R"({"ids":[0,1,2,3,4]})", ",4"},                 // nothing is left past 3
        {R"({"tens":[10,5]})", "]}"},                     // 5 may still become 50
        {R"({"tens":[10,10]})", "]}"},                    // 10 may still become 100
        {R"({"tens":[1000000000000000000,1]})", ",1"}}},  // nothing past 1e18
      {"property names",  // propertyNames of an enum / const (pydantic's dict[AnEnum, V])
       R"({"type": "object", "properties": {
             "d": {"type": "object", "additionalProperties": {"type": "integer"},
                   "propertyNames": {"enum": ["x", "y", 3]}},
             "e": {"type": "object", "additionalProperties": {"type": "string"},
                   "propertyNames": {"$ref": "#/$defs/C"}},
             "f": {"type": "object", "properties": {"a": {"type": "boolean"}, "z": {}},
                   "propertyNames": {"enum": ["a", "b"]}},
             "g": {"propertyNames": {"const": "k"}}},
           "$defs": {"C": {"enum": ["a", "b\"q"], "type": "string"}}})",
       {R"({"d":{"x":1,"y":2},"e":{"b\"q":"s"}})", R"({"d":{},"e":{},"f":{"a":true}})",
        R"({"d":{"y":-3},"e":{"a":""},"f":{},"g":{"k":[{}]}})"},
       {{R"({"d":{"z":1}})", "z\""},            //
        {R"({"d":{"y":1,"x":2}})", ",\"x"},     // in the enum's order: none after y
        {R"({"d":{"x":"s"}})", "\"s"},          // additionalProperties
        {R"({"e":{"c":"s"}})", "c\""},          //
        {R"({"f":{"z":null}})", "z\""},         // not a name it allows
        {R"({"f":{"a":true,"b":1}})", ",\"b"},  // listed properties: no others
        {R"({"g":{"j":1}})", "j\""}}},          //
      {"member counts",  // minProperties / maxProperties beside required and other keys
       R"({"type": "object", "properties": {
             "d": {"type": "object", "additionalProperties": {"type": "integer"},
                   "minProperties": 1, "maxProperties": 2},
             "p": {"type": "object", "properties": {"a": {"type": "integer"},
                   "b": {"type": "integer"}, "c": {"type": "integer"}}, "required": ["c"],
                   "minProperties": 2, "maxProperties": 2},
             "q": {"type": "object", "properties": {"a": {}, "b": {}},
                   "additionalProperties": {"type": "null"}, "required": ["b"],
                   "maxProperties": 2},
             "e": {"propertyNames": {"enum": ["x", "y", "z"]}, "minProperties": 2}}})",
       {R"({"d":{"x":1}})", R"({"d":{"x":1,"y":2},"p":{"a":1,"c":3}})",
        R"({"p":{"b":2,"c":3},"q":{"b":1}})", R"({"q":{"a":1,"b":[]},"e":{"x":1,"z":2}})",
        R"({"q":{"o":null,"b":0},"e":{"y":1,"z":2}})"},
       {{R"({"d":{}})", "}}"},                           // minProperties
        {R"({"d":{"x":1,"y":2,"z":3}})", ",\"z"},        // maxProperties
        {R"({"p":{"c":3}})", "c\""},                     // one more is due before c
        {R"({"p":{"a":1,"b":2}})", "b\""},               // then no room for c
        {R"({"q":{"a":1,"o":null}})", "o\""},            // room is left for b only
        {R"({"q":{"o":null,"a":1}})", "a\""},            //
        {R"({"q":{"b":1,"o":null,"x":null}})", ",\"x"},  //
        {R"({"e":{"z":1}})", "z\""}}},                   // nothing could follow z
      {"top-level number bounds",
       R"({"type": "number", "minimum": -1.5, "maximum": 1e3})",
       {"-1.5", "1000", "999.99", "-0.75", "0"},
       {{"-1.6", "6"}, {"1000.5", "5"}, {"-2", "2"}, {"5e2", "e2"}}},
      {"any", "{}", {R"("s")", "[1,{}]", "null", R"({"a":[{}]})", "-1.5e3"}, {{"[1,]", "]"}}},
      {"json mode",
       std::string(kJsonObjectSchema),
       {"{}", R"({"a":[1,"b",{"c":null}]})"},
       {{"[]", "[]"}, {R"({"a":1} )", " "}}},
  };
  return cases;
}

TEST(JsonSchema, TakesItsDocumentsAndRefusesAtTheFirstImpossibleByte) {
  for (const SchemaCase& c : schema_cases()) {
    JsonRecognizer rec = recognizer(c.schema);
    const auto schema = testing::OrderedJson::parse(c.schema);
    for (const std::string& doc : c.valid) {
      JsonState s = rec.start();
      EXPECT_TRUE(rec.advance(s, doc)) << c.name << ": " << doc;
      EXPECT_TRUE(rec.accepting(s)) << c.name << ": " << doc;
      const auto value = testing::OrderedJson::parse(doc);
      EXPECT_TRUE(testing::schema_accepts(schema, value, schema)) << c.name << ": " << doc;
    }
    for (const auto& [text, at] : c.refused) {
      const size_t want = text.find(at);
      ASSERT_NE(want, std::string::npos) << text;
      const Verdict v = run(rec, text);
      EXPECT_EQ(v.taken, want) << c.name << ": " << text;
      EXPECT_FALSE(v.complete) << c.name << ": " << text;
    }
  }
}

TEST(JsonSchema, EndsWhereTheDocumentIsWhole) {
  JsonRecognizer number = recognizer(R"({"type": "number"})");
  JsonState s = number.start();
  ASSERT_TRUE(number.advance(s, "12"));
  EXPECT_TRUE(number.accepting(s));  // may end, or go on: "123"
  EXPECT_FALSE(number.finished(s));
  JsonRecognizer object = recognizer(R"({"properties": {"a": {"const": true}}})");
  s = object.start();
  ASSERT_TRUE(object.advance(s, R"({"a":true)"));
  EXPECT_FALSE(object.accepting(s));
  ASSERT_TRUE(object.advance(s, "}"));
  EXPECT_TRUE(object.finished(s));
}

TEST(JsonSchema, ErrorsNameTheKeywordAndThePlace) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type": "string", "pattern": "(a"})", "at '#/pattern': pattern: a missing ')'"},
      {R"({"pattern": "^(a|b)*a(a|b){10}$", "maxLength": 10000})", "too large to follow"},
      {R"({"pattern": "^(ab)+$", "maxLength": 1})", "the schema accepts no value"},
      {R"({"pattern": "^\\x01$"})", "the schema accepts no value"},
      {R"({"pattern": 5})", "'pattern' must be a string"},
      {R"({"properties": {"tags": {"type": "array", "uniqueItems": true}}})",
       "at '#/properties/tags': 'uniqueItems' is supported for items of one enum, const, "
       "boolean or integer schema"},
      {R"({"type": "array", "items": {"type": "string"}, "uniqueItems": true})",
       "'uniqueItems' is supported for items of one enum"},
      {R"({"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 3},
           "uniqueItems": true, "minItems": 4})",
       "the schema accepts no value"},
      {R"({"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": 1})",
       "'uniqueItems' must be a boolean"},
      {R"({"type": "array", "items": {"enum": ["a", "b"]}, "uniqueItems": true, "minItems": 3})",
       "the schema accepts no value"},
      {R"({"type": "object", "if": {}})", "'if' is not supported"},
      {R"({"properties": {"a": {}}, "additionalProperties": false, "minProperties": 2})",
       "the schema accepts no value"},
      {R"({"properties": {"a": {}, "b": {}}, "required": ["a", "b"], "maxProperties": 1})",
       "the schema accepts no value"},
      {R"({"type": "object", "minProperties": 3, "maxProperties": 2})",
       "the schema accepts no value"},
      {R"({"type": "object", "maxProperties": -1})", "'maxProperties' must be a non-negative"},
      {R"({"type": "object", "propertyNames": {"pattern": "^a"}})",
       "'propertyNames' other than an enum or const of strings is not supported"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["a"],
           "propertyNames": {"enum": ["b"]}})",
       "required \"a\" is not one of 'propertyNames'"},
      {R"({"type": "number", "multipleOf": 0})", "'multipleOf' must be a number greater than 0"},
      {R"({"type": "number", "multipleOf": "5"})", "'multipleOf' must be a number greater than 0"},
      {R"({"type": "number", "multipleOf": 1e-10})", "more than 9 decimal places is not supported"},
      {R"({"type": "integer", "multipleOf": 1e19})", "'multipleOf' beyond 1e18 is not supported"},
      {R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})",
       "the schema accepts no value"},
      {R"({"type": "number", "minimum": 2, "maximum": 1.5})", "the schema accepts no value"},
      {R"({"exclusiveMinimum": 1, "exclusiveMaximum": 1.000000001})",  // no unit between them
       "the schema accepts no value"},
      {R"({"type": "number", "maximum": -2e18})", "'maximum' beyond 1e18 is not supported"},
      {R"({"type": "integer", "minimum": 1e19})", "'minimum' beyond 1e18 is not supported"},
      {R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true})", "must be a number"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "the schema accepts no value"},
      {R"({"type": "strin"})", "unknown type \"strin\""},
      {R"({"$ref": "#/$defs/missing"})", "names nothing in the schema"},
      {R"({"$ref": "https://example.com/s.json"})", "only references inside the schema"},
      {R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
       "refers to itself with no value in between"},
      {R"({"type": "object", "required": ["x"]})", "required \"x\" is not one of 'properties'"},
      {R"({"allOf": [{}, {}]})", "'allOf' of more than one schema is not supported"},
      {R"({"type": "string", "anyOf": [{}]})", "'anyOf' beside other constraints"},
      {R"({"type": "array", "items": [{}]})", "a tuple) is not supported"},
      {R"({"enum": []})", "the schema accepts no value"},
      {R"({"type": "array", "minItems": 2, "maxItems": 1})", "the schema accepts no value"},
      {R"({"properties": {"a": false}, "required": ["a"]})", "the schema accepts no value"},
      {"{\"type\": ", "not valid JSON"},
      {"3", "a schema must be an object or a boolean, got integer"},
      {R"({"type": "string", "maxLength": 70000})", "'maxLength' above 65535 is not supported"},
      {R"({"type": "array", "minItems": -1})", "'minItems' must be a non-negative integer"},
  };
  for (const auto& [schema, want] : cases) {
    auto g = JsonGrammar::compile(schema);
    ASSERT_FALSE(g.ok()) << schema;
    EXPECT_NE(g.error().message.find(want), std::string::npos) << schema << "\n"
                                                               << g.error().message;
  }
}

// Random walks through each grammar, each byte drawn among those it takes (closing ones favoured
// as the text grows): no walk meets a dead end (a text no byte continues is whole), and every
// text a walk ends (where the grammar says it may) is one the schema accepts.
TEST(JsonSchema, RandomWalksEndInDocumentsTheSchemaAccepts) {
  std::mt19937 rng(3);
  for (const SchemaCase& c : schema_cases()) {
    JsonRecognizer rec = recognizer(c.schema);
    const auto schema = testing::OrderedJson::parse(c.schema);
    int ended = 0;
    for (int walk = 0; walk < 100; ++walk) {
      JsonState s = rec.start();
      std::string text;
      while (!rec.finished(s) && text.size() < 3000) {
        const double hurry = std::min(0.95, static_cast<double>(text.size()) / 200.0);
        if (rec.accepting(s) && std::uniform_real_distribution<>(0, 1)(rng) < hurry) break;
        std::vector<uint8_t> takes, closing;
        for (int b = 0; b < 256; ++b) {
          JsonState t;
          if (!rec.advance_into(s, static_cast<uint8_t>(b), t)) continue;
          takes.push_back(static_cast<uint8_t>(b));
          if (std::string_view("\"}]0").find(static_cast<char>(b)) != std::string_view::npos) {
            closing.push_back(static_cast<uint8_t>(b));
          }
        }
        if (takes.empty()) {  // e.g. an integer's leading 0 at the top: nothing may follow
          ASSERT_TRUE(rec.accepting(s)) << c.name << ": a dead end after " << text;
          break;
        }
        const bool close = !closing.empty() && std::uniform_real_distribution<>(0, 1)(rng) < hurry;
        const std::vector<uint8_t>& from = close ? closing : takes;
        const uint8_t b = from[rng() % from.size()];
        ASSERT_TRUE(rec.advance(s, b));
        text += static_cast<char>(b);
      }
      if (!rec.accepting(s)) continue;
      ++ended;
      testing::OrderedJson value;
      try {
        value = testing::OrderedJson::parse(text);
      } catch (const testing::OrderedJson::out_of_range&) {
        continue;  // a number past a double's range: JSON's grammar has no bound
      } catch (const testing::OrderedJson::exception& e) {
        if (text.find("\\u") != std::string::npos) continue;  // unpaired surrogates
        FAIL() << c.name << ": " << e.what() << "\n" << text;
      }
      EXPECT_TRUE(testing::schema_accepts(schema, value, schema)) << c.name << ": " << text;
    }
    EXPECT_GT(ended, 70) << c.name;
  }
}

TEST_P(JsonTokens, TheTrieWalkAllowsExactlyTheTokensTheStateTakes) {
  const int vocab = tokenizer.vocab_size() + 3;  // logit rows past the tokenizer's: never allowed
  const std::vector<int32_t> eos = tokenizer.eos_ids();
  auto made = JsonVocab::create(tokenizer, vocab, eos);
  ASSERT_TRUE(made.ok()) << made.error().message;
  std::vector<bool> is_eos(static_cast<size_t>(vocab), false);
  for (int32_t id : eos) is_eos[static_cast<size_t>(id)] = true;
  int states = 0;
  std::vector<std::pair<std::string, std::vector<std::string>>> grammars = {
      {std::string(kJsonObjectSchema), kValid}};
  for (const SchemaCase& c : schema_cases()) grammars.emplace_back(c.schema, c.valid);
  for (const auto& [schema, docs] : grammars) {
    auto g = JsonGrammar::compile(schema);
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto constraint = JsonConstraint::create(*made, std::move(g).value());
    ASSERT_TRUE(constraint.ok()) << constraint.error().message;
    JsonConstraint& json = **constraint;
    JsonRecognizer& rec = json.recognizer();
    for (const JsonState& s : states_of(rec, docs)) {
      const std::vector<uint64_t> bits = json.allowed(s);  // a copy: the cache may move on
      int allowed = 0;
      for (int32_t id = 0; id < vocab; ++id) {
        const bool got = (bits[static_cast<size_t>(id) / 64] >> (id % 64)) & 1u;
        bool want = false;
        if (rec.finished(s)) {
          want = is_eos[static_cast<size_t>(id)];
        } else if (is_eos[static_cast<size_t>(id)]) {
          want = rec.accepting(s);
        } else if (id < tokenizer.vocab_size() && !tokenizer.is_special(id)) {
          const std::string b = tokenizer.token_bytes(id);
          JsonState t = s;
          want = !b.empty() && rec.advance(t, b);
          JsonState u = s;
          EXPECT_EQ(json.advance(u, id), want) << "token " << id;
          if (want) {
            EXPECT_TRUE(u == t);
          }
        }
        ASSERT_EQ(got, want) << "token " << id << " '" << tokenizer.token_bytes(id) << "' in "
                             << schema;
        allowed += got;
      }
      EXPECT_GT(allowed, 0);
      ++states;
    }
  }
  EXPECT_GT(states, 600);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, JsonTokens, ::testing::Values("bytelevel", "spm"));

// A pattern string's states that no token tells apart share one mask (the walk is done once): in
// a 40-letter counter, the characters far from the bound; near it, masks of their own.
TEST(JsonConstraint, AlikePatternStatesShareAMask) {
  auto vocab = std::make_shared<const JsonVocab>(
      std::vector<std::string>{"\"", "a", "aa", "aaa", "b", "{", "}", "[", "]", ",", ":"},
      std::vector<int32_t>{});
  JsonConstraint json(
      vocab, JsonGrammar::compile(R"({"type": "string", "pattern": "^a{1,40}$"})").value());
  JsonState s = json.start();
  ASSERT_TRUE(json.advance(s, 0));  // "
  std::vector<const std::vector<uint64_t>*> masks;
  for (int k = 0; k < 40; ++k) {
    masks.push_back(&json.allowed(s));
    ASSERT_TRUE(json.advance(s, 1)) << k;  // a
  }
  // Up to 37 a's, "aaa" (the longest token) still fits; from 38 on, fewer do.
  for (int k = 2; k <= 37; ++k) EXPECT_EQ(masks[static_cast<size_t>(k)], masks[1]) << k;
  EXPECT_NE(*masks[38], *masks[1]);
  EXPECT_NE(*masks[39], *masks[38]);
  EXPECT_EQ((*masks[39])[0] & 0xF, 0b0011u);  // '"' and "a" only
}

TEST(JsonConstraint, SmallVocabularies) {
  auto t = Tokenizer::load(std::filesystem::path(QS_SOURCE_DIR) / "models/tokenizers/bytelevel");
  ASSERT_TRUE(t.ok());
  auto bytes = std::make_shared<const JsonVocab>(std::vector<std::string>{"{", "}", "\""},
                                                 std::vector<int32_t>{});
  JsonConstraint small(bytes, JsonGrammar::compile(kJsonObjectSchema).value());
  JsonState s = small.start();
  EXPECT_TRUE(small.advance(s, 0));
  EXPECT_FALSE(small.advance(s, 0));  // "{{"
  EXPECT_TRUE(small.advance(s, 1));
  EXPECT_TRUE(small.finished(s));
  // A vocabulary of one token cannot spell every byte JSON needs.
  auto clipped = JsonVocab::create(*t, 1, {});
  ASSERT_FALSE(clipped.ok());
  EXPECT_NE(clipped.error().message.find("no token for the single byte"), std::string::npos)
      << clipped.error().message;
  // Nor the bytes of a schema's names and values.
  auto named = JsonConstraint::create(bytes, JsonGrammar::compile(R"({"const": "x"})").value());
  ASSERT_FALSE(named.ok());
  EXPECT_NE(named.error().message.find("single byte 0x78"), std::string::npos)
      << named.error().message;
}

}  // namespace
}  // namespace qs
