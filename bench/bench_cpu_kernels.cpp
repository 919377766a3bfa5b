// CPU kernels alone: the attention's row kernels (one thread, operands in L1), the decode
// matmuls (a 4096 x 1536 weight, 64 copies streamed from memory) on 1 and on all threads, and
// the host's per-token log-probability reduction (token_logprob over a Llama-3 vocabulary), and
// JSON mode's mask of a parser state over a synthetic 128K-token vocabulary (the trie walk, the
// one host cost a state meets for the first time).
//
//   bench_cpu_kernels [--threads N (all)]
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string_view>
#include <vector>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/json_constraint.h"
#include "engine/sampler.h"
#include "model/weights.h"
#include "quant/weight_quant.h"

namespace {

using Clock = std::chrono::steady_clock;

// Median seconds per call of fn over `reps` timed repetitions of `calls` calls each.
template <class Fn>
double time_per_call(int reps, int calls, const Fn& fn) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto a = Clock::now();
    for (int c = 0; c < calls; ++c) fn(c);
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count() / calls);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

void row_kernels() {
  const int hd = 64, n = 64, calls = 20000;
  const std::vector<float> rows = randn(size_t(n) * hd, 1), w = randn(hd, 2), coef = randn(n, 3);
  std::vector<float> out(n), acc(hd, 0.0f), s = randn(8192, 4);
  const double dot = time_per_call(
      5, calls, [&](int) { qs::cpu::dot_rows(w.data(), rows.data(), hd, hd, n, out.data()); });
  const double axpy = time_per_call(
      5, calls, [&](int) { qs::cpu::axpy_rows(coef.data(), rows.data(), hd, n, acc.data(), hd); });
  const double soft = time_per_call(5, 200, [&](int) { qs::cpu::softmax_row(s.data(), 8192); });
  fmt::print(
      "row kernels (one thread, head_dim {}, {} rows in L1): dot_rows {:.2f} ns per row, "
      "axpy_rows {:.2f} ns per row, softmax_row {:.3f} ns per element\n",
      hd, n, dot * 1e9 / n, axpy * 1e9 / n, soft * 1e9 / 8192);
}

void matmuls(int threads) {
  const int64_t rows = 4096, cols = 1536;
  const int copies = 64;
  const std::vector<float> wf = randn(size_t(rows * cols), 5);
  auto w4 = qs::quantize_weight4(wf.data(), qs::DType::F32, rows, cols, 128, "w", nullptr);
  if (!w4.ok()) std::abort();
  const std::vector<qs::QuantizedWeight4> q4(copies, *w4);
  std::vector<uint16_t> bf(size_t(rows * cols) * copies);
  for (size_t i = 0; i < bf.size(); ++i) bf[i] = qs::f32_to_bf16(wf[i % wf.size()]);
  const std::vector<float> x = randn(size_t(cols) * 8, 6);
  std::vector<float> y(size_t(rows) * 8);
  for (int t : {1, threads}) {
    qs::CpuBackend be(t);
    const double tq = time_per_call(3, copies * 2, [&](int c) {
      be.matmul_q4(x.data(), 1, q4[c % copies], nullptr, y.data());
    });
    auto bf16_view = [&](int c) {
      qs::WeightView v;
      v.name = "w";
      v.dtype = qs::DType::BF16;
      v.rows = rows;
      v.cols = cols;
      v.data = bf.data() + size_t(c % copies) * rows * cols;
      return v;
    };
    double tb[2];
    const int ms[2] = {1, 5};
    for (int k = 0; k < 2; ++k) {
      tb[k] = time_per_call(
          3, copies * 2, [&](int c) { be.matmul_gemv(x.data(), ms[k], bf16_view(c), y.data()); });
    }
    fmt::print(
        "{} x {} matmuls, {} thread(s): 4-bit m = 1 {:.1f} us ({:.1f} GB/s of codes + "
        "metadata); bf16 m = 1 {:.1f} us ({:.1f} GB/s), m = 5 {:.1f} us\n",
        rows, cols, t, tq * 1e6, q4[0].bytes() / tq / 1e9, tb[0] * 1e6,
        rows * cols * 2 / tb[0] / 1e9, tb[1] * 1e6);
  }
}

}  // namespace

// What a request asking for logprobs adds per generated token on the host: log_softmax of a
// 128256-entry row and its `top` alternatives (engine/sampler.h token_logprob).
void logprobs() {
  const int vocab = 128256;
  const std::vector<float> row = randn(vocab, 7);
  volatile float sink = 0;  // keeps the calls
  for (int top : {0, 5, 20}) {
    const double s = time_per_call(
        5, 20, [&](int c) { sink = sink + qs::token_logprob(row.data(), vocab, c, top).logprob; });
    fmt::print("token_logprob vocab {} top {:2}: {:7.1f} us per token\n", vocab, top, s * 1e6);
  }
}

// Constrained JSON: JsonConstraint::allowed for states it has not met (the walk; a met one is a
// lookup), over 128256 tokens: the 256 bytes, then pseudo-words of 1-10 letters (half with a
// leading space, as a BPE vocabulary's), some with JSON punctuation around them. JSON mode, then a
// recursive schema (a listed key due, a bounded string, an enum value), then a bounded number and
// a string with a pattern.
void json_masks() {
  const int vocab = 128256;
  std::mt19937 g(11);
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.emplace_back(1, static_cast<char>(b));
  const char* punct[] = {"", "\"", "\":", "\",", ",", "{\"", "}", "]", "\n", "  "};
  while (static_cast<int>(bytes.size()) < vocab) {
    std::string w = g() % 2 ? " " : "";
    const int len = 1 + static_cast<int>(g() % 10);
    for (int i = 0; i < len; ++i) w += static_cast<char>('a' + g() % 26);
    if (g() % 4 == 0) w = punct[g() % 10] + w + punct[g() % 10];
    bytes.push_back(w);
  }
  const auto t0 = Clock::now();
  auto trie = std::make_shared<const qs::JsonVocab>(std::move(bytes), std::vector<int32_t>{});
  fmt::print("json: trie of {} tokens built in {:.1f} ms\n", vocab,
             std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
  // Each depth is a state of its own: `open` (an object and an array) repeated `depth` times,
  // then `tail` (within kJsonMaxDepth).
  auto time_states = [&](qs::JsonConstraint& json, const char* name, const std::string& open,
                         const std::string& tail) {
    std::vector<double> t;
    for (int depth = 1; depth <= 30; ++depth) {
      qs::JsonState s = json.start();
      std::string text;
      for (int d = 0; d < depth; ++d) text += open;
      if (!json.recognizer().advance(s, text + tail)) std::abort();
      const auto a = Clock::now();
      const std::vector<uint64_t>& bits = json.allowed(s);
      t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
      if (bits.empty()) std::abort();
    }
    std::sort(t.begin(), t.end());
    fmt::print("json: mask of a new state {:<32} {:6.2f} ms (median of {})\n", name,
               t[t.size() / 2] * 1e3, t.size());
  };
  qs::JsonConstraint mode(trie, qs::JsonGrammar::compile(qs::kJsonObjectSchema).value());
  time_states(mode, "(json mode, a value is due)", "{\"k\":[", "");
  time_states(mode, "(json mode, in a string)", "{\"k\":[", "\"abc");
  time_states(mode, "(json mode, after a number)", "{\"k\":[", "12");
  qs::JsonConstraint schema(trie, qs::JsonGrammar::compile(R"({"$defs": {"n": {"type": "object",
      "properties": {"name": {"type": "string", "maxLength": 40},
                     "kind": {"enum": ["alpha", "beta", "gamma"]},
                     "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
      "required": ["name", "kind"]}}, "$ref": "#/$defs/n"})")
                                      .value());
  const std::string node = R"({"name":"a","kind":"beta","kids":[)";
  time_states(schema, "(schema, a listed key is due)", node, "{\"");
  time_states(schema, "(schema, in a bounded string)", node, "{\"name\":\"ab");
  time_states(schema, "(schema, that string 2 chars on)", node, "{\"name\":\"abcd");
  time_states(schema, "(schema, in an enum value)", node, "{\"name\":\"a\",\"kind\":\"");
  qs::JsonConstraint numbers(trie, qs::JsonGrammar::compile(R"({"$defs": {"a": {"type": "array",
      "items": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "number", "minimum": 0, "maximum": 100}]}}},
      "$ref": "#/$defs/a"})")
                                       .value());
  time_states(numbers, "(schema, in a bounded number)", "[", "42.5");
  qs::JsonConstraint patterns(trie, qs::JsonGrammar::compile(R"({"$defs": {"a": {"type": "array",
      "items": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string", "pattern": "^[a-z]+-\\d+$"}]}}},
      "$ref": "#/$defs/a"})")
                                        .value());
  time_states(patterns, "(schema, in a pattern string)", "[", "\"abc");
  for (const auto& [format, tail, name] :
       {std::tuple{"date-time", "\"2024-01-", "(schema, in a date-time string)"},
        std::tuple{"email", "\"john.doe@exa", "(schema, in an email string)"},
        std::tuple{"uri", "\"https://example.com/a", "(schema, in a uri string)"}}) {
    qs::JsonConstraint formats(
        trie, qs::JsonGrammar::compile(fmt::format(R"({{"$defs": {{"a": {{"type": "array",
        "items": {{"anyOf": [{{"$ref": "#/$defs/a"}}, {{"type": "string", "format": "{}"}}]}}}}}},
        "$ref": "#/$defs/a"}})",
                                                   format))
                  .value());
    time_states(formats, name, "[", tail);
  }
  // A whole string's masks, first met: every state from its opening quote to its closing one.
  for (const auto& [format, text] : {std::pair{"email", "\"john.doe@example-mail.com\""},
                                     std::pair{"uri", "\"https://www.example.com/docs/a?q=1\""},
                                     std::pair{"date-time", "\"2024-01-15T10:30:00Z\""}}) {
    qs::JsonConstraint json(
        trie,
        qs::JsonGrammar::compile(fmt::format(R"({{"type": "string", "format": "{}"}})", format))
            .value());
    qs::JsonState s = json.start();
    const auto a = Clock::now();
    for (const char* c = text; *c != '\0'; ++c) {
      if (json.allowed(s).empty() || !json.recognizer().advance(s, static_cast<uint8_t>(*c))) {
        std::abort();
      }
    }
    fmt::print("json: masks of a whole {:<9} string, first met  {:6.2f} ms ({} bytes)\n", format,
               std::chrono::duration<double>(Clock::now() - a).count() * 1e3,
               std::string_view(text).size());
  }
  // Compiling a pattern happens on the request's path (the server validates the schema).
  for (const char* regex : {R"(^[a-z]+-\d+$)", "^a{1000}$", "^(a|b)*a(a|b){10}$",
                            "(a|b)*a(a|b){12}", R"(^[\w.+-]+@[\w-]+\.[\w.]+$)"}) {
    const auto a = Clock::now();
    auto p = qs::JsonPattern::compile(regex);
    const double ms = std::chrono::duration<double>(Clock::now() - a).count() * 1e3;
    if (!p.ok()) {
      fmt::print("json: pattern {:<30} refused in {:7.2f} ms: {}\n", regex, ms, p.error().message);
      continue;
    }
    fmt::print("json: pattern {:<30} compiled in {:7.2f} ms ({} states)\n", regex, ms, p->states());
  }
  // tool_choice "required" among 64 tools (the server's schema shape): every reading is alive
  // while the call's name is read. A fresh constraint per sample, so that each mask is walked.
  std::string tools = R"({"type": "array", "minItems": 1, "items": {"anyOf": [)";
  for (int i = 0; i < qs::kJsonMaxThreads; ++i) {
    tools += fmt::format(R"({}{{"type": "object", "properties": {{"name": {{"const": "tool_{}"}},
        "arguments": {{"type": "object", "properties": {{"x{}": {{"type": "integer"}}}}}}}},
        "required": ["name", "arguments"]}})",
                         i ? "," : "", i, i);
  }
  tools += "]}}";
  std::vector<double> t;
  for (int sample = 0; sample < 10; ++sample) {
    qs::JsonConstraint json(trie, qs::JsonGrammar::compile(tools).value());
    qs::JsonState s = json.start();
    if (!json.recognizer().advance(s, R"([{"name":"tool_)")) std::abort();
    const auto a = Clock::now();
    if (json.allowed(s).empty()) std::abort();
    t.push_back(std::chrono::duration<double>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  fmt::print("json: mask of a new state {:<32} {:6.2f} ms (median of {})\n",
             fmt::format("(a name among {} tools)", qs::kJsonMaxThreads), t[t.size() / 2] * 1e3,
             t.size());
}

int main(int argc, char** argv) {
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      fmt::print(stderr, "usage: {} [--threads N (all)]\n", argv[0]);
      return 2;
    }
  }
  if (threads <= 0) threads = qs::CpuBackend().num_threads();
  fmt::print("bench_cpu_kernels: threads 1 and {}\n", threads);
  row_kernels();
  matmuls(threads);
  logprobs();
  json_masks();
  return 0;
}
