// Tool calling (app/server/tools.h): request reading, the constraining schema, and the calls taken
// out of replies in each model format, whole and fed in pieces.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "engine/json_schema.h"
#include "tools.h"

namespace qs::server {
namespace {

const char* kWeatherTools = R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                   "unit": {"enum": ["C", "F"]}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "now"}}])";

ToolRequest request(const std::string& extra = "") {
  Json body = Json::parse(std::string(R"({"tools": )") + kWeatherTools + extra + "}");
  ToolRequest t;
  auto e = read_tools(body, &t);
  EXPECT_FALSE(e) << e->message;
  return t;
}

// The error read_tools gives `body`, as "param: message".
std::string tools_error(const std::string& body) {
  ToolRequest t;
  auto e = read_tools(Json::parse(body), &t);
  return e ? e->param + ": " + e->message : "";
}

// Whether the grammar of `schema` takes `doc` as a whole document.
bool accepts(const std::string& schema, const std::string& doc) {
  auto g = JsonGrammar::compile(schema);
  EXPECT_TRUE(g.ok()) << g.error().message;
  JsonRecognizer r(std::move(g).value());
  JsonState s = r.start();
  return r.advance(s, doc) && r.accepting(s);
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(Tools, FormatIsReadFromTheChatTemplate) {
  const std::string dir = std::string(QS_SOURCE_DIR) + "/tests/chat/data/templates/";
  EXPECT_EQ(tool_format_of(read_file(dir + "qwen2.5-instruct.jinja")), ToolFormat::kHermes);
  EXPECT_EQ(tool_format_of(read_file(dir + "mistral-v0.3.jinja")), ToolFormat::kMistral);
  EXPECT_EQ(tool_format_of(read_file(dir + "llama3.2-instruct.jinja")), ToolFormat::kLlama3Json);
  EXPECT_EQ(tool_format_of(read_file(dir + "llama2-chat.jinja")), ToolFormat::kHermes);
  EXPECT_EQ(tool_format_of("{{ '<|python_tag|>' }}"), ToolFormat::kLlama3Json);
}

TEST(Tools, ChoiceDefaultsAndForms) {
  EXPECT_EQ(request().choice, ToolChoice::kAuto);
  EXPECT_TRUE(request().parallel);
  EXPECT_EQ(request(R"(, "tool_choice": "none")").choice, ToolChoice::kNone);
  EXPECT_EQ(request(R"(, "tool_choice": "required")").choice, ToolChoice::kRequired);
  const ToolRequest named =
      request(R"(, "tool_choice": {"type": "function", "function": {"name": "now"}})");
  EXPECT_EQ(named.choice, ToolChoice::kFunction);
  EXPECT_EQ(named.function, "now");
  EXPECT_FALSE(request(R"(, "parallel_tool_calls": false)").parallel);
  ToolRequest none;
  EXPECT_FALSE(read_tools(Json::parse(R"({"tools": [], "tool_choice": "auto"})"), &none));
  EXPECT_EQ(none.choice, ToolChoice::kNone);
}

TEST(Tools, BadRequestsNameTheParameter) {
  const std::string f = R"({"type": "function", "function": {"name": "f"}})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"tools": 3})", "tools: 'tools' must be an array, got integer"},
      {R"({"tools": [{"type": "retrieval"}]})", "tools[0].type"},
      {R"({"tools": [{"type": "function"}]})", "tools[0].function"},
      {R"({"tools": [{"type": "function", "function": {"name": "a b"}}]})",
       "tools[0].function.name"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "x": 1}}]})",
       "tools[0].function.x"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]})",
       "tools[0].function.parameters"},
      {R"({"tools": [)" + f + "," + f + "]}", "tools[1].function.name: two tools are named 'f'"},
      {R"({"tools": [)" + f + R"(], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"tool_choice": "required"})", "tool_choice: tool_choice 'required' needs 'tools'"},
      {R"({"tools": [)" + f +
           R"(], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name: tool_choice names function 'g', which is not in 'tools'"},
      {R"({"tools": [)" + f + R"(], "tool_choice": {"type": "function"}})", "tool_choice.function"},
      {R"({"tools": [)" + f + R"(], "parallel_tool_calls": 1})", "parallel_tool_calls"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters":
           {"type": "object", "properties": {"s": {"type": "object", "patternProperties": {"^a": {}}}}}}}],
           "tool_choice": "required"})",
       "tools[0].function.parameters: json_schema at '#/properties/s': 'patternProperties' is not "
       "supported"},
  };
  for (const auto& [body, want] : cases) {
    const std::string got = tools_error(body);
    EXPECT_EQ(got.substr(0, want.size()), want) << body;
  }
  // The same parameters are fine where nothing constrains the reply.
  EXPECT_EQ(tools_error(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters":
           {"type": "object", "properties": {"s": {"type": "object", "patternProperties": {"^a": {}}}}}}}]})"),
            "");
  // "required" among more tools than the recognizer follows at once.
  std::string many = R"({"tool_choice": "required", "tools": [)";
  for (size_t i = 0; i <= kMaxRequiredTools; ++i)
    many += (i ? "," : "") + std::string(R"({"type": "function", "function": {"name": "f)") +
            std::to_string(i) + "\"}}";
  EXPECT_EQ(tools_error(many + "]}").substr(0, 12), "tool_choice:");
}

TEST(Tools, OutputSchemaTakesCallsOfTheGivenTools) {
  const ToolRequest required = request(R"(, "tool_choice": "required")");
  const std::string schema = tool_output_schema(required, ToolFormat::kHermes);
  EXPECT_TRUE(accepts(schema, R"([{"name": "get_weather", "arguments": {"city": "Paris"}}])"));
  EXPECT_TRUE(accepts(schema, R"([{"name": "now", "arguments": {}},
                                  {"name": "get_weather", "arguments": {"city": "x", "unit": "F"}}])"));
  EXPECT_FALSE(accepts(schema, R"([])"));
  EXPECT_FALSE(accepts(schema, R"([{"name": "later", "arguments": {}}])"));
  EXPECT_FALSE(accepts(schema, R"([{"name": "now", "arguments": {"x": 1}}])"));  // no arguments
  EXPECT_FALSE(accepts(schema, R"([{"name": "get_weather", "arguments": {"unit": "C"}}])"));
  EXPECT_FALSE(accepts(schema, R"([{"name": "now", "parameters": {}}])"));
  // Llama 3's key; one call without parallel calls.
  const std::string llama = tool_output_schema(request(R"(, "tool_choice": "required",
      "parallel_tool_calls": false)"),
                                               ToolFormat::kLlama3Json);
  EXPECT_TRUE(accepts(llama, R"([{"name": "now", "parameters": {}}])"));
  EXPECT_FALSE(accepts(llama, R"([{"name": "now", "parameters": {}}, {"name": "now",
                                  "parameters": {}}])"));
  // A named function: its arguments object alone.
  const std::string named = tool_output_schema(
      request(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
      ToolFormat::kHermes);
  EXPECT_TRUE(accepts(named, R"({"city": "Oslo"})"));
  EXPECT_FALSE(accepts(named, R"({"unit": "C"})"));
  EXPECT_EQ(tool_output_schema(request(), ToolFormat::kHermes), "");
  // Every one of kMaxRequiredTools tools can be called (each is a reading while names are read).
  std::string many = R"({"tool_choice": "required", "tools": [)";
  for (size_t i = 0; i < kMaxRequiredTools; ++i)
    many += (i ? "," : "") + std::string(R"({"type": "function", "function": {"name": "tool_)") +
            std::to_string(i) + "\"}}";
  ToolRequest t;
  ASSERT_FALSE(read_tools(Json::parse(many + "]}"), &t));
  const std::string all = tool_output_schema(t, ToolFormat::kHermes);
  for (size_t i : {size_t{0}, size_t{17}, kMaxRequiredTools - 1}) {
    EXPECT_TRUE(accepts(all, R"([{"name": "tool_)" + std::to_string(i) + R"(", "arguments": {}}])"))
        << i;
  }
}

TEST(Tools, OutputSchemaFollowsReferencesInsideParameters) {
  Json body = Json::parse(R"({"tool_choice": "required", "tools": [
    {"type": "function", "function": {"name": "a"}},
    {"type": "function", "function": {"name": "tree", "parameters": {
      "$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
                "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                "required": ["v"]}},
      "type": "object", "properties": {"root": {"$ref": "#/$defs/node"},
                                       "tag": {"const": {"$ref": "#x"}}},
      "required": ["root"]}}}]})");
  ToolRequest t;
  ASSERT_FALSE(read_tools(body, &t));
  const std::string schema = tool_output_schema(t, ToolFormat::kHermes);
  EXPECT_TRUE(accepts(schema, R"([{"name": "tree", "arguments":
                                  {"root": {"v": 1, "kids": [{"v": 2, "kids": []}]}}}])"));
  EXPECT_TRUE(accepts(schema, R"([{"name": "tree", "arguments":
                                  {"root": {"v": 1}, "tag": {"$ref":"#x"}}}])"));
  EXPECT_FALSE(accepts(schema, R"([{"name": "tree", "arguments": {"root": {"kids": []}}}])"));
}

// Feeds `pieces` to a reader; returns the content sent on the way and the reply at the end.
std::pair<std::string, ToolReply> read_reply(const ToolRequest& t, ToolFormat f,
                                             const std::vector<std::string>& pieces) {
  ToolReplyReader reader(t, f);
  std::string sent;
  for (const auto& p : pieces) sent += reader.feed(p).content;
  return {sent, reader.finish()};
}

// The text cut into pieces of n bytes.
std::vector<std::string> pieces_of(const std::string& text, size_t n) {
  std::vector<std::string> out;
  for (size_t i = 0; i < text.size(); i += n) out.push_back(text.substr(i, n));
  return out;
}

TEST(Tools, HermesCallsAfterContent) {
  const ToolRequest t = request();
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n"
      "</tool_call>";
  for (size_t n : {1, 3, 7, 1000}) {
    auto [sent, reply] = read_reply(t, ToolFormat::kHermes, pieces_of(text, n));
    EXPECT_EQ(sent, "Let me check.\n") << n;
    EXPECT_EQ(reply.content, "");
    ASSERT_EQ(reply.calls.size(), 2u);
    EXPECT_EQ(reply.calls[0].name, "get_weather");
    EXPECT_EQ(reply.calls[0].arguments, R"({"city":"Paris"})");
    EXPECT_EQ(reply.calls[1].arguments, "{}");
    EXPECT_EQ(reply.calls[0].id.substr(0, 5), "call_");
    EXPECT_EQ(reply.calls[0].id.size(), 29u);
    EXPECT_NE(reply.calls[0].id, reply.calls[1].id);
  }
  // A text that only looks like the tag's start goes out once it differs.
  auto [sent, reply] = read_reply(t, ToolFormat::kHermes, {"a <tool", "_cal", "x> b"});
  EXPECT_EQ(sent + reply.content, "a <tool_calx> b");
  EXPECT_TRUE(reply.calls.empty());
}

TEST(Tools, RepliesThatAreNotCallsAreContent) {
  const ToolRequest t = request();
  for (const std::string bad : {
           "<tool_call>{\"name\": \"later\", \"arguments\": {}}</tool_call>",  // not a tool
           "<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>",   // not an object
           "<tool_call>{\"name\": \"now\", \"arguments\": {</tool_call>",      // cut
           "<tool_call>{\"name\": \"now\"}</tool_call> and then some words",   // text after it
       }) {
    auto [sent, reply] = read_reply(t, ToolFormat::kHermes, pieces_of(bad, 5));
    EXPECT_EQ(sent + reply.content, bad);
    EXPECT_TRUE(reply.calls.empty()) << bad;
  }
  // An argument text in a string is parsed; a missing closing tag at the end is forgiven.
  auto [sent, reply] = read_reply(t, ToolFormat::kHermes,
                                  {R"(<tool_call>{"name": "now", "arguments": "{\"a\": 1}"})"});
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"a":1})");
}

TEST(Tools, Llama3AndMistralReplies) {
  const ToolRequest t = request();
  const std::string llama =
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"a;b\"}}; {\"name\": \"now\", "
      "\"parameters\": {}}";
  auto [sent, reply] = read_reply(t, ToolFormat::kLlama3Json, pieces_of(llama, 4));
  EXPECT_EQ(sent, "");
  ASSERT_EQ(reply.calls.size(), 2u);
  EXPECT_EQ(reply.calls[0].arguments, R"({"city":"a;b"})");
  // Text first: it all streams, and no call is looked for.
  auto [sent2, reply2] = read_reply(t, ToolFormat::kLlama3Json, {"  ", "Hi {", "\"name\"}"});
  EXPECT_EQ(sent2, "  Hi {\"name\"}");
  EXPECT_EQ(reply2.content, "");
  EXPECT_TRUE(reply2.calls.empty());

  for (
      const std::string mistral :
      {R"( [{"name": "now", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "x"}}])",
       R"([TOOL_CALLS] [{"name": "now", "arguments": {}}, {"name": "get_weather",
           "arguments": {"city": "x"}}])"}) {
    auto [s, r] = read_reply(t, ToolFormat::kMistral, pieces_of(mistral, 6));
    EXPECT_EQ(s, "");
    ASSERT_EQ(r.calls.size(), 2u) << mistral;
    EXPECT_EQ(r.calls[1].name, "get_weather");
    EXPECT_EQ(r.calls[0].id.size(), 9u);  // the template's rule
  }
  auto [s3, r3] = read_reply(t, ToolFormat::kMistral, {"[1, 2] is a list"});
  EXPECT_EQ(s3 + r3.content, "[1, 2] is a list");
  EXPECT_TRUE(r3.calls.empty());
}

TEST(Tools, ConstrainedRepliesAndFinishReasons) {
  const ToolRequest required = request(R"(, "tool_choice": "required")");
  auto [sent, reply] =
      read_reply(required, ToolFormat::kHermes, {R"([{"name": "now", "arguments": {}}])"});
  EXPECT_EQ(sent, "");
  ASSERT_EQ(reply.calls.size(), 1u);
  EXPECT_EQ(tool_finish_reason(required, reply, "stop"), "tool_calls");
  // Cut by max_tokens: no calls, the text is content, the reason stays.
  auto [sent2, cut] = read_reply(required, ToolFormat::kHermes, {R"([{"name": "no)"});
  EXPECT_EQ(cut.content, R"([{"name": "no)");
  EXPECT_EQ(tool_finish_reason(required, cut, "length"), "length");

  // A named function: its arguments go out as they come, the first piece with the call's id and
  // name; leading whitespace is left out.
  const ToolRequest named =
      request(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})");
  ToolReplyReader reader(named, ToolFormat::kHermes);
  EXPECT_TRUE(reader.feed(" \n").tool_calls.empty());
  const Json first = reader.feed(R"( {"ci)").tool_calls;
  const Json second = reader.feed(R"(ty": "Rome"})").tool_calls;
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0]["index"], 0);
  EXPECT_EQ(first[0]["function"]["name"], "get_weather");
  EXPECT_EQ(first[0]["id"].get<std::string>().substr(0, 5), "call_");
  ASSERT_EQ(second.size(), 1u);
  EXPECT_FALSE(second[0].contains("id"));
  EXPECT_EQ(first[0]["function"]["arguments"].get<std::string>() +
                second[0]["function"]["arguments"].get<std::string>(),
            R"({"city": "Rome"})");
  // At the end: the same call, whole, marked as already sent (nothing goes out twice).
  const ToolReply rest = reader.finish();
  EXPECT_TRUE(rest.streamed && rest.content.empty());
  ASSERT_EQ(rest.calls.size(), 1u);
  EXPECT_EQ(rest.calls[0].id, first[0]["id"]);
  EXPECT_EQ(rest.calls[0].arguments, R"({"city": "Rome"})");
  EXPECT_EQ(tool_finish_reason(named, rest, "stop"), "stop");  // as OpenAI for a named function
  // A reply with nothing visible still makes its call; the whole reply is its arguments.
  auto [sent3, empty] = read_reply(named, ToolFormat::kHermes, {"  "});
  ASSERT_EQ(empty.calls.size(), 1u);
  EXPECT_EQ(empty.calls[0].arguments, "");
  EXPECT_FALSE(empty.streamed);
  Json choice = {{"message", {{"role", "assistant"}, {"content", R"( {"city": "Ro)"}}},
                 {"finish_reason", "length"}};
  take_tool_calls(named, ToolFormat::kHermes, &choice);
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["arguments"], R"({"city": "Ro)");
  EXPECT_EQ(choice["finish_reason"], "length");

  const ToolRequest none = request(R"(, "tool_choice": "none")");
  auto [sent4, plain] = read_reply(none, ToolFormat::kHermes, {"<tool_call>{", "}"});
  EXPECT_EQ(sent4, "<tool_call>{}");
  EXPECT_TRUE(plain.calls.empty() && plain.content.empty());
}

// tool_choice "required" streams each call as it comes: its id and name once the name is whole,
// then its arguments as written, whatever the pieces the reply arrives in; the end gives the
// same calls, marked as sent. Cut by max_tokens, the calls are cut too.
TEST(Tools, RequiredCallsStreamAsTheyCome) {
  const ToolRequest required = request(R"(, "tool_choice": "required")");
  const std::string text =
      " [ {\"name\": \"get_weather\", \"arguments\": {\"city\": \"R\\\"o}m[e\", \"unit\": \"C\"}} "
      ",\n"
      "{\"name\":\"now\",\"parameters\":{}}]";
  for (size_t n : {1, 2, 3, 7, 1000}) {
    ToolReplyReader reader(required, ToolFormat::kHermes);
    std::vector<Json> deltas;
    for (const std::string& p : pieces_of(text, n)) {
      const ToolReplyPart part = reader.feed(p);
      EXPECT_EQ(part.content, "");
      for (const Json& d : part.tool_calls) deltas.push_back(d);
    }
    std::vector<std::string> ids(2), names(2), args(2);
    for (const Json& d : deltas) {
      const size_t i = d["index"].get<size_t>();
      ASSERT_LT(i, 2u);
      if (d.contains("id")) {
        EXPECT_TRUE(ids[i].empty()) << "one first delta per call";
        ids[i] = d["id"].get<std::string>();
        names[i] = d["function"]["name"].get<std::string>();
      } else {
        EXPECT_FALSE(ids[i].empty()) << "arguments only after the call's id and name";
      }
      args[i] += d["function"]["arguments"].get<std::string>();
    }
    EXPECT_EQ(names, (std::vector<std::string>{"get_weather", "now"})) << n;
    EXPECT_EQ(args[0], R"({"city": "R\"o}m[e", "unit": "C"})") << n;
    EXPECT_EQ(args[1], "{}") << n;
    if (n == 1) {
      EXPECT_GT(deltas.size(), 30u);  // byte by byte: many pieces
    }
    const ToolReply reply = reader.finish();
    EXPECT_TRUE(reply.streamed && reply.content.empty());
    ASSERT_EQ(reply.calls.size(), 2u);
    EXPECT_EQ(reply.calls[0].id, ids[0]);
    EXPECT_EQ(reply.calls[1].id, ids[1]);
    EXPECT_EQ(reply.calls[0].arguments, args[0]);
    EXPECT_EQ(tool_finish_reason(required, reply, "stop"), "tool_calls");
  }
  auto [sent, cut] =
      read_reply(required, ToolFormat::kHermes, {R"([{"name": "get_weather", "arguments": {"ci)"});
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, R"({"ci)");
  EXPECT_EQ(tool_finish_reason(required, cut, "length"), "length");
}

TEST(Tools, ChoiceMessagesGetTheirCalls) {
  const ToolRequest t = request();
  Json choice = {
      {"index", 0},
      {"message", {{"role", "assistant"}, {"content", "<tool_call>{\"name\": \"now\"}"}}},
      {"finish_reason", "stop"}};
  take_tool_calls(t, ToolFormat::kHermes, &choice);
  EXPECT_TRUE(choice["message"]["content"].is_null());
  EXPECT_EQ(choice["message"]["tool_calls"][0]["function"]["name"], "now");
  EXPECT_EQ(choice["message"]["tool_calls"][0]["type"], "function");
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  Json text = {{"message", {{"role", "assistant"}, {"content", "Sunny."}}},
               {"finish_reason", "stop"}};
  take_tool_calls(t, ToolFormat::kHermes, &text);
  EXPECT_EQ(text["message"]["content"], "Sunny.");
  EXPECT_FALSE(text["message"].contains("tool_calls"));
  const Json deltas = tool_calls_json({{"id1", "now", "{}"}}, /*index=*/true);
  EXPECT_EQ(deltas[0]["index"], 0);
}

TEST(Tools, MessageCallsBecomeTemplateForm) {
  Json out;
  auto e = read_message_tool_calls(Json::parse(R"([{"id": "c1", "type": "function",
      "function": {"name": "f", "arguments": "{\"x\": [1]}"}},
      {"id": "c2", "function": {"name": "g", "arguments": ""}}])"),
                                   "messages[1].tool_calls", &out);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(out[0]["function"]["arguments"], Json::parse(R"({"x": [1]})"));
  EXPECT_EQ(out[1]["function"]["arguments"], Json::object());
  EXPECT_EQ(out[1]["type"], "function");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {R"({"id": "c"})", "messages[1].tool_calls: "},
      {R"([{"function": {"name": "f", "arguments": "{}"}}])", "messages[1].tool_calls[0].id"},
      {R"([{"id": "c", "function": {"name": "f"}}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"id": "c", "function": {"name": "f", "arguments": "[1]"}}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"id": "c", "function": {"name": "f", "arguments": "{"}}])",
       "messages[1].tool_calls[0].function.arguments"},
      {R"([{"id": "c", "type": "code", "function": {"name": "f", "arguments": "{}"}}])",
       "messages[1].tool_calls[0].type"},
  };
  for (const auto& [calls, want] : bad) {
    auto err = read_message_tool_calls(Json::parse(calls), "messages[1].tool_calls", &out);
    ASSERT_TRUE(err) << calls;
    EXPECT_EQ((err->param + ": ").substr(0, want.size()), want) << calls;
  }
}

}  // namespace
}  // namespace qs::server
