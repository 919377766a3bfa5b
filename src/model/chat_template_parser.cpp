// Chat-template parser: expressions (ExprParser) and statements (TemplateParser).
#include "model/chat_template_parser.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "model/chat_template_lexer.h"

namespace qs::chat_template_internal {

const std::set<std::string>& supported_filters() {
  static const std::set<std::string> names = {
      "abs",        "capitalize", "count",    "d",       "default", "dictsort", "e",
      "escape",     "first",      "float",    "indent",  "int",     "items",    "join",
      "last",       "length",     "list",     "lower",   "map",     "max",      "min",
      "reject",     "rejectattr", "replace",  "reverse", "round",   "safe",     "select",
      "selectattr", "sort",       "string",   "sum",     "title",   "tojson",   "trim",
      "unique",     "upper",      "wordcount"};
  return names;
}

const std::set<std::string>& supported_tests() {
  static const std::set<std::string> names = {
      "boolean", "callable",  "defined", "divisibleby", "eq",          "equalto",  "escaped",
      "even",    "false",     "float",   "ge",          "greaterthan", "gt",       "in",
      "integer", "iterable",  "le",      "lessthan",    "lower",       "lt",       "mapping",
      "ne",      "none",      "number",  "odd",         "sameas",      "sequence", "string",
      "true",    "undefined", "upper",   "==",          "!=",          "<",        "<=",
      ">",       ">="};
  return names;
}

namespace {

// ------------------------------------------------------------------------------------------------
// Parser
// ------------------------------------------------------------------------------------------------

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : toks_(std::move(tokens)), line_(line) {}

  const Token& peek(size_t ahead = 0) const {
    return toks_[std::min(pos_ + ahead, toks_.size() - 1)];
  }
  bool at_end() const { return peek().type == TokenType::kEnd; }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).type == TokenType::kName && peek(ahead).text == name;
  }
  Token next() { return toks_[std::min(pos_++, toks_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(line_, std::string("expected '") + op + "', found " + describe(peek()));
    ++pos_;
  }
  std::string expect_name() {
    if (peek().type != TokenType::kName) fail(line_, "expected a name, found " + describe(peek()));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected " + describe(peek()));
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEnd:
        return "end of tag";
      case TokenType::kString:
        return "string literal";
      default:
        return "'" + t.text + "'";
    }
  }

  ExprPtr parse_expression(bool with_condition = true) {
    ExprPtr e = parse_or();
    while (with_condition && is_name("if")) {
      ++pos_;
      ExprPtr cond = parse_or();
      ExprPtr otherwise;
      if (is_name("else")) {
        ++pos_;
        otherwise = parse_expression();
      }
      auto node = make(Expr::Kind::kCondition);
      node->args.push_back(std::move(e));
      node->args.push_back(std::move(cond));
      node->args.push_back(std::move(otherwise));  // may be null: undefined
      e = std::move(node);
    }
    return e;
  }

  // `a, b` (for `{% set x = a, b %}`) gives a list.
  ExprPtr parse_tuple() {
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto list = make(Expr::Kind::kList);
    list->tuple = true;
    list->args.push_back(std::move(first));
    while (is_op(",")) {
      ++pos_;
      if (at_end()) break;
      list->args.push_back(parse_expression());
    }
    return list;
  }

 private:
  ExprPtr make(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  ExprPtr binary(Op op, ExprPtr a, ExprPtr b) {
    auto e = make(Expr::Kind::kBinary);
    e->op = op;
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      ++pos_;
      e = binary(Op::kOr, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      ++pos_;
      e = binary(Op::kAnd, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      ++pos_;
      auto e = make(Expr::Kind::kUnary);
      e->op = Op::kNot;
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    for (;;) {
      Op op;
      if (is_op("=="))
        op = Op::kEq;
      else if (is_op("!="))
        op = Op::kNe;
      else if (is_op("<"))
        op = Op::kLt;
      else if (is_op("<="))
        op = Op::kLe;
      else if (is_op(">"))
        op = Op::kGt;
      else if (is_op(">="))
        op = Op::kGe;
      else if (is_name("in"))
        op = Op::kIn;
      else if (is_name("not") && is_name("in", 1))
        op = Op::kNotIn;
      else
        break;
      pos_ += op == Op::kNotIn ? 2 : 1;
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare);
        cmp->args.push_back(std::move(first));
      }
      cmp->compare_ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Op op = is_op("+") ? Op::kAdd : Op::kSub;
      ++pos_;
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      ++pos_;
      e = binary(Op::kConcat, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (is_op("*"))
        op = Op::kMul;
      else if (is_op("/"))
        op = Op::kDiv;
      else if (is_op("//"))
        op = Op::kFloorDiv;
      else if (is_op("%"))
        op = Op::kMod;
      else
        break;
      ++pos_;
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      ++pos_;
      e = binary(Op::kPow, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Op op = is_op("-") ? Op::kNeg : Op::kPos;
      ++pos_;
      e = make(Expr::Kind::kUnary);
      e->op = op;
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token t = next();
    switch (t.type) {
      case TokenType::kName: {
        if (t.text == "true" || t.text == "True") return literal(Value::from_bool(true));
        if (t.text == "false" || t.text == "False") return literal(Value::from_bool(false));
        if (t.text == "none" || t.text == "None") return literal(Value::none());
        auto e = make(Expr::Kind::kName);
        e->name = t.text;
        return e;
      }
      case TokenType::kString: {
        std::string s = t.text;
        while (peek().type == TokenType::kString) s += next().text;  // "a" "b" concatenates
        return literal(Value::from_string(std::move(s)));
      }
      case TokenType::kInt:
        return literal(Value::from_int(t.integer));
      case TokenType::kFloat:
        return literal(Value::from_float(t.number));
      case TokenType::kOp:
        if (t.text == "(") {
          if (is_op(")")) {
            ++pos_;
            auto empty = make(Expr::Kind::kList);
            empty->tuple = true;
            return empty;
          }
          ExprPtr e = parse_expression();
          if (is_op(",")) {
            auto list = make(Expr::Kind::kList);
            list->tuple = true;
            list->args.push_back(std::move(e));
            while (is_op(",")) {
              ++pos_;
              if (is_op(")")) break;
              list->args.push_back(parse_expression());
            }
            e = std::move(list);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto list = make(Expr::Kind::kList);
          while (!is_op("]")) {
            list->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("]");
          return list;
        }
        if (t.text == "{") {
          auto dict = make(Expr::Kind::kDict);
          while (!is_op("}")) {
            dict->args.push_back(parse_expression());
            expect_op(":");
            dict->args.push_back(parse_expression());
            if (!is_op(",")) break;
            ++pos_;
          }
          expect_op("}");
          return dict;
        }
        break;
      case TokenType::kEnd:
        break;
    }
    fail(line_, "unexpected " + describe(t) + " in expression");
  }

  ExprPtr literal(Value v) {
    auto e = make(Expr::Kind::kLiteral);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        ++pos_;
        if (peek().type == TokenType::kInt) {
          auto item = make(Expr::Kind::kGetItem);
          item->args.push_back(std::move(e));
          item->args.push_back(literal(Value::from_int(next().integer)));
          e = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::kGetAttr);
        attr->name = expect_name();
        attr->args.push_back(std::move(e));
        e = std::move(attr);
      } else if (is_op("[")) {
        ++pos_;
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        ++pos_;
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr subject) {
    ExprPtr parts[3];
    int colons = 0;
    if (!is_op(":")) parts[0] = parse_expression();
    while (is_op(":") && colons < 2) {
      ++pos_;
      ++colons;
      if (!is_op(":") && !is_op("]")) parts[colons] = parse_expression();
    }
    expect_op("]");
    if (colons == 0) {
      auto item = make(Expr::Kind::kGetItem);
      item->args.push_back(std::move(subject));
      item->args.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = make(Expr::Kind::kSlice);
    slice->args.push_back(std::move(subject));
    for (auto& p : parts) slice->args.push_back(std::move(p));
    return slice;
  }

  // After "(": positional and keyword arguments up to ")". The callee becomes args[0].
  ExprPtr parse_call(ExprPtr callee) {
    auto call = make(Expr::Kind::kCall);
    call->args.push_back(std::move(callee));
    parse_arguments(*call);
    return call;
  }
  void parse_arguments(Expr& target) {
    while (!is_op(")")) {
      if (is_op("*") || is_op("**"))
        fail(line_, "unsupported construct: *args / **kwargs in a call");
      if (peek().type == TokenType::kName && is_op("=", 1)) {
        std::string key = next().text;
        ++pos_;
        target.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!target.kwargs.empty()) fail(line_, "positional argument after keyword argument");
        target.args.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      ++pos_;
    }
    expect_op(")");
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        ++pos_;
        auto f = make(Expr::Kind::kFilter);
        f->name = expect_name();
        if (!supported_filters().count(f->name))
          fail(line_, "unsupported filter '" + f->name + "'");
        f->args.push_back(std::move(e));
        if (is_op("(")) {
          ++pos_;
          parse_arguments(*f);
        }
        e = std::move(f);
      } else if (is_name("is")) {
        ++pos_;
        auto t = make(Expr::Kind::kTest);
        if (is_name("not")) {
          ++pos_;
          t->negated = true;
        }
        t->name = expect_name();
        if (!supported_tests().count(t->name)) fail(line_, "unsupported test '" + t->name + "'");
        t->args.push_back(std::move(e));
        if (is_op("(")) {
          ++pos_;
          parse_arguments(*t);
        } else if ((peek().type == TokenType::kName || peek().type == TokenType::kString ||
                    peek().type == TokenType::kInt || peek().type == TokenType::kFloat ||
                    is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and") && !is_name("if") &&
                   !is_name("in") && !is_name("not")) {
          t->args.push_back(parse_postfix(parse_primary()));  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else if (is_op("(")) {
        ++pos_;
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int line_;
};

class TemplateParser {
 public:
  explicit TemplateParser(std::vector<Segment> segments) : segs_(std::move(segments)) {}

  NodeList parse() {
    std::string end;
    NodeList nodes = parse_body({}, &end, nullptr);
    return nodes;
  }

 private:
  // Parse nodes until a statement whose keyword is in `terminators` (returned in *found with its
  // parser, positioned after the keyword).
  NodeList parse_body(const std::vector<std::string>& terminators, std::string* found,
                      std::unique_ptr<ExprParser>* found_parser) {
    NodeList nodes;
    while (i_ < segs_.size()) {
      const Segment& seg = segs_[i_++];
      if (seg.kind == SegmentKind::kText) {
        auto n = make(Node::Kind::kText, seg.line);
        n->text = seg.text;
        nodes.push_back(std::move(n));
        continue;
      }
      auto p = std::make_unique<ExprParser>(lex_tag(seg.text, seg.line), seg.line);
      if (seg.kind == SegmentKind::kOutput) {
        auto n = make(Node::Kind::kOutput, seg.line);
        n->expr = p->parse_expression();
        p->expect_end();
        nodes.push_back(std::move(n));
        continue;
      }
      if (p->at_end()) fail(seg.line, "empty tag '{% %}'");
      const std::string keyword = p->expect_name();
      if (std::find(terminators.begin(), terminators.end(), keyword) != terminators.end()) {
        *found = keyword;
        if (found_parser) *found_parser = std::move(p);
        return nodes;
      }
      if (keyword == "raw" || keyword == "endraw") continue;  // the scanner took the body as text
      if (keyword == "if") {
        nodes.push_back(parse_if(*p, seg.line));
      } else if (keyword == "for") {
        nodes.push_back(parse_for(*p, seg.line));
      } else if (keyword == "set") {
        nodes.push_back(parse_set(*p, seg.line));
      } else if (keyword == "break" || keyword == "continue") {
        p->expect_end();
        if (loop_depth_ == 0) fail(seg.line, "'" + keyword + "' outside of a loop");
        nodes.push_back(
            make(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, seg.line));
      } else if (keyword == "macro") {
        nodes.push_back(parse_macro(*p, seg.line));
      } else if (keyword == "generation") {
        p->expect_end();
        auto n = make(Node::Kind::kGeneration, seg.line);
        n->body = parse_block(seg.line, "generation", {"endgeneration"});
        nodes.push_back(std::move(n));
      } else if (keyword.rfind("end", 0) == 0 || keyword == "elif" || keyword == "else") {
        fail(seg.line, "unexpected '{% " + keyword + " %}'");
      } else {
        fail(seg.line,
             "unsupported tag '{% " + keyword +
                 " %}' (supported: if, for, set, macro, break, continue, raw, generation)");
      }
    }
    if (!terminators.empty()) {
      fail(segs_.empty() ? 0 : segs_.back().line,
           "missing '{% " + terminators.back() + " %}' at the end of the template");
    }
    return nodes;
  }

  NodeList parse_block(int line, const std::string& what, const std::vector<std::string>& ends,
                       std::string* found = nullptr,
                       std::unique_ptr<ExprParser>* parser = nullptr) {
    std::string end;
    std::unique_ptr<ExprParser> p;
    NodeList body = parse_body(ends, &end, &p);
    if (end.empty()) fail(line, "'{% " + what + " %}' is not closed");
    if (found) *found = end;
    if (parser) {
      *parser = std::move(p);
    } else {
      p->expect_end();
    }
    return body;
  }

  std::unique_ptr<Node> make(Node::Kind kind, int line) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = line;
    return n;
  }

  std::unique_ptr<Node> parse_if(ExprParser& p, int line) {
    auto n = make(Node::Kind::kIf, line);
    ExprPtr cond = p.parse_expression();
    p.expect_end();
    for (;;) {
      std::string end;
      std::unique_ptr<ExprParser> ep;
      NodeList body = parse_block(line, "if", {"elif", "else", "endif"}, &end, &ep);
      n->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = ep->parse_expression();
        ep->expect_end();
        continue;
      }
      ep->expect_end();
      if (end == "else") n->else_body = parse_block(line, "if", {"endif"});
      return n;
    }
  }

  std::unique_ptr<Node> parse_for(ExprParser& p, int line) {
    auto n = make(Node::Kind::kFor, line);
    const bool paren = p.is_op("(");
    if (paren) p.next();
    n->targets.push_back(p.expect_name());
    while (p.is_op(",")) {
      p.next();
      n->targets.push_back(p.expect_name());
    }
    if (paren) p.expect_op(")");
    if (!p.is_name("in")) fail(line, "expected 'in' in '{% for %}'");
    p.next();
    n->expr = p.parse_expression(/*with_condition=*/false);
    if (p.is_name("if")) {
      p.next();
      n->filter = p.parse_expression();
    }
    if (p.is_name("recursive")) fail(line, "unsupported construct: recursive for loops");
    p.expect_end();
    ++loop_depth_;
    std::string end;
    n->body = parse_block(line, "for", {"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") n->else_body = parse_block(line, "for", {"endfor"});
    return n;
  }

  std::unique_ptr<Node> parse_set(ExprParser& p, int line) {
    std::string first = p.expect_name();
    if (p.is_op(".")) {
      p.next();
      auto n = make(Node::Kind::kSetAttr, line);
      n->targets = {first, p.expect_name()};
      p.expect_op("=");
      n->expr = p.parse_tuple();
      p.expect_end();
      return n;
    }
    std::vector<std::string> targets = {first};
    while (p.is_op(",")) {
      p.next();
      targets.push_back(p.expect_name());
    }
    if (p.at_end() && targets.size() == 1) {
      auto n = make(Node::Kind::kSetBlock, line);
      n->targets = targets;
      n->body = parse_block(line, "set", {"endset"});
      return n;
    }
    if (p.is_op("|")) fail(line, "unsupported construct: filtered block set");
    p.expect_op("=");
    auto n = make(Node::Kind::kSet, line);
    n->targets = std::move(targets);
    n->expr = p.parse_tuple();
    p.expect_end();
    return n;
  }

  std::unique_ptr<Node> parse_macro(ExprParser& p, int line) {
    auto n = make(Node::Kind::kMacro, line);
    n->text = p.expect_name();
    p.expect_op("(");
    while (!p.is_op(")")) {
      n->params.push_back(p.expect_name());
      if (p.is_op("=")) {
        p.next();
        n->defaults.push_back(p.parse_expression());
      } else {
        n->defaults.push_back(nullptr);
      }
      if (!p.is_op(",")) break;
      p.next();
    }
    p.expect_op(")");
    p.expect_end();
    const int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_block(line, "macro", {"endmacro"});
    loop_depth_ = saved;
    return n;
  }

  std::vector<Segment> segs_;
  size_t i_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

NodeList parse_template(std::string_view source) {
  return TemplateParser(scan_template(source)).parse();
}

}  // namespace qs::chat_template_internal
