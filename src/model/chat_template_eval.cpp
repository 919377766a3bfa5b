// Chat-template renderer.
#include "model/chat_template_eval.h"

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

namespace qs::chat_template_internal {

// ------------------------------------------------------------------------------------------------
// Renderer
// ------------------------------------------------------------------------------------------------

namespace {

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Argument `index` or keyword `name`; nullptr when absent.
  const Value* get(size_t index, const char* name) const {
    if (index < positional.size()) return &positional[index];
    for (const auto& [k, v] : keyword) {
      if (k == name) return &v;
    }
    return nullptr;
  }
};

class Renderer {
 public:
  Renderer(std::shared_ptr<Scope> root, const Scope& globals)
      : globals_(globals), scopes_{std::move(root)} {}

  void render(const NodeList& nodes, std::string& out) {
    std::string* saved = out_;
    out_ = &out;
    render_nodes(nodes);
    out_ = saved;
  }

 private:
  // --- statements ---

  void emit(const std::string& s) {
    out_->append(s);
    if (out_->size() > kMaxOutputBytes) fail(0, "rendered text exceeds 16 MiB");
  }

  void render_nodes(const NodeList& nodes) {
    for (const auto& n : nodes) {
      if (break_ || continue_) return;
      render_node(*n);
    }
  }

  void render_node(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kText:
        emit(n.text);
        return;
      case Node::Kind::kOutput:
        emit(py_str(eval(*n.expr)));
        return;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (truthy(eval(*cond))) {
            render_nodes(body);
            return;
          }
        }
        render_nodes(n.else_body);
        return;
      case Node::Kind::kFor:
        render_for(n);
        return;
      case Node::Kind::kSet:
        assign(n.targets, eval(*n.expr), n.line);
        return;
      case Node::Kind::kSetAttr: {
        Value ns = lookup(n.targets[0]);
        if (!ns.is_map() || !ns.map->is_namespace) {
          fail(n.line, "cannot assign attribute '" + n.targets[1] + "' on '" + n.targets[0] +
                           "': not a namespace()");
        }
        ns.map->set(n.targets[1], eval(*n.expr));
        return;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        render(n.body, captured);
        scopes_.back()->insert_or_assign(n.targets[0], Value::from_string(std::move(captured)));
        return;
      }
      case Node::Kind::kBreak:
        break_ = true;
        return;
      case Node::Kind::kContinue:
        continue_ = true;
        return;
      case Node::Kind::kMacro: {
        Callable c;
        c.name = n.text;
        c.macro = &n;
        scopes_.back()->insert_or_assign(n.text, Value::from_callable(std::move(c)));
        return;
      }
      case Node::Kind::kGeneration:
        render_nodes(n.body);
        return;
    }
  }

  void assign(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) {
      scopes_.back()->insert_or_assign(targets[0], v);
      return;
    }
    ValueList items = iterate(v, line);
    if (items.size() != targets.size()) {
      fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                     std::to_string(targets.size()) + " names");
    }
    for (size_t i = 0; i < targets.size(); ++i)
      scopes_.back()->insert_or_assign(targets[i], items[i]);
  }

  void render_for(const Node& n) {
    const ValueList all = iterate(eval(*n.expr), n.line);
    scopes_.push_back(std::make_shared<Scope>());
    ValueList items;
    if (n.filter) {
      for (const Value& item : all) {
        assign(n.targets, item, n.line);
        if (truthy(eval(*n.filter))) items.push_back(item);
      }
    } else {
      items = all;
    }
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      assign(n.targets, items[i], n.line);
      auto loop = std::make_shared<ValueMap>();
      loop->items = {{"index", Value::from_int(i + 1)},
                     {"index0", Value::from_int(i)},
                     {"revindex", Value::from_int(len - i)},
                     {"revindex0", Value::from_int(len - i - 1)},
                     {"first", Value::from_bool(i == 0)},
                     {"last", Value::from_bool(i == len - 1)},
                     {"length", Value::from_int(len)},
                     {"depth", Value::from_int(1)},
                     {"depth0", Value::from_int(0)},
                     {"previtem", i > 0 ? items[i - 1] : Value::undefined("loop.previtem")},
                     {"nextitem", i + 1 < len ? items[i + 1] : Value::undefined("loop.nextitem")}};
      scopes_.back()->insert_or_assign("loop", Value::from_map(std::move(loop)));
      render_nodes(n.body);
      continue_ = false;
      if (break_) {
        break_ = false;
        break;
      }
    }
    scopes_.pop_back();
    if (items.empty()) render_nodes(n.else_body);
  }

  // --- values ---

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    auto g = globals_.find(name);
    if (g != globals_.end()) return g->second;
    return Value::undefined(name);
  }

  ValueList iterate(const Value& v, int line) const {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return {};
      case Value::Kind::kList:
        return *v.list;
      case Value::Kind::kMap: {
        ValueList keys;
        for (const auto& [k, item] : v.map->items) keys.push_back(Value::from_string(k));
        return keys;
      }
      case Value::Kind::kString: {
        ValueList chars;
        std::vector<size_t> offs = code_point_offsets(v.text);
        for (size_t i = 0; i + 1 < offs.size(); ++i) {
          chars.push_back(Value::from_string(v.text.substr(offs[i], offs[i + 1] - offs[i])));
        }
        return chars;
      }
      default:
        fail(line, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  struct DepthGuard {
    explicit DepthGuard(int& d, int line) : depth(d) {
      if (++depth > kMaxDepth) fail(line, "expression or macro calls nested too deeply");
    }
    ~DepthGuard() { --depth; }
    int& depth;
  };

  Value eval(const Expr& e) {
    DepthGuard guard(depth_, e.line);
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList: {
        ValueList items;
        for (const auto& a : e.args) items.push_back(eval(*a));
        return Value::from_list(std::move(items), e.tuple);
      }
      case Expr::Kind::kDict: {
        auto m = std::make_shared<ValueMap>();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
          Value k = eval(*e.args[i]);
          if (!k.is_string()) fail(e.line, "dict keys must be strings");
          m->set(k.text, eval(*e.args[i + 1]));
        }
        return Value::from_map(std::move(m));
      }
      case Expr::Kind::kGetAttr:
        return get_attr(eval(*e.args[0]), e.name, e.line);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice:
        return slice(e);
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter: {
        Value subject = eval(*e.args[0]);
        return apply_filter(e.name, subject, eval_args(e, 1), e.line);
      }
      case Expr::Kind::kTest: {
        Value subject = eval(*e.args[0]);
        const bool r = apply_test(e.name, subject, eval_args(e, 1), e.line);
        return Value::from_bool(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        if (e.op == Op::kNot) return Value::from_bool(!truthy(eval(*e.args[0])));
        Value v = eval(*e.args[0]);
        if (v.is_undefined()) fail(e.line, undefined_message(v));
        if (!v.is_number())
          fail(e.line, std::string("bad operand type for unary -: '") + type_name(v) + "'");
        if (e.op == Op::kPos) return v.kind == Value::Kind::kBool ? Value::from_int(v.as_int()) : v;
        if (v.kind == Value::Kind::kFloat) return Value::from_float(-v.number);
        return Value::from_int(-v.as_int());
      }
      case Expr::Kind::kBinary: {
        if (e.op == Op::kAnd) {
          Value a = eval(*e.args[0]);
          return truthy(a) ? eval(*e.args[1]) : a;
        }
        if (e.op == Op::kOr) {
          Value a = eval(*e.args[0]);
          return truthy(a) ? a : eval(*e.args[1]);
        }
        return binary(e.op, eval(*e.args[0]), eval(*e.args[1]), e.line);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.args[0]);
        for (size_t i = 0; i < e.compare_ops.size(); ++i) {
          Value right = eval(*e.args[i + 1]);
          if (!compare(e.compare_ops[i], left, right, e.line)) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::kCondition:
        if (truthy(eval(*e.args[1]))) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : Value::undefined();
    }
    return Value::undefined();
  }

  CallArgs eval_args(const Expr& e, size_t first) {
    CallArgs a;
    for (size_t i = first; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keyword.emplace_back(k, eval(*v));
    return a;
  }

  static Value get_attr(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) {
      fail(line, undefined_message(obj) + " (cannot read its attribute '" + name + "')");
    }
    if (obj.is_map()) {
      const Value* v = obj.map->find(name);
      return v ? *v : Value::undefined(name);
    }
    return Value::undefined(name);
  }

  static Value get_item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) fail(line, undefined_message(obj) + " (cannot index it)");
    if (obj.is_map()) {
      if (!key.is_string()) return Value::undefined();
      const Value* v = obj.map->find(key.text);
      return v ? *v : Value::undefined(key.text);
    }
    if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
      std::vector<size_t> offs;
      int64_t n;
      if (obj.is_list()) {
        n = static_cast<int64_t>(obj.list->size());
      } else {
        offs = code_point_offsets(obj.text);
        n = static_cast<int64_t>(offs.size()) - 1;
      }
      int64_t i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("index " + std::to_string(key.as_int()));
      if (obj.is_list()) return (*obj.list)[static_cast<size_t>(i)];
      return Value::from_string(obj.text.substr(offs[i], offs[i + 1] - offs[i]));
    }
    return Value::undefined();
  }

  Value slice(const Expr& e) {
    Value obj = eval(*e.args[0]);
    if (obj.is_undefined()) fail(e.line, undefined_message(obj) + " (cannot slice it)");
    std::optional<int64_t> bounds[3];
    for (int k = 0; k < 3; ++k) {
      if (!e.args[k + 1]) continue;
      Value b = eval(*e.args[k + 1]);
      if (b.is_none()) continue;
      if (!b.is_integral()) fail(e.line, "slice indices must be integers");
      bounds[k] = b.as_int();
    }
    std::vector<size_t> offs;
    int64_t n;
    if (obj.is_list()) {
      n = static_cast<int64_t>(obj.list->size());
    } else if (obj.is_string()) {
      offs = code_point_offsets(obj.text);
      n = static_cast<int64_t>(offs.size()) - 1;
    } else {
      fail(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
      if (!v) return dflt;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(bounds[0], step > 0 ? 0 : n - 1);
    const int64_t stop = clamp(bounds[1], step > 0 ? n : -1);
    std::vector<int64_t> idx;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx.push_back(i);
    if (obj.is_list()) {
      ValueList items;
      for (int64_t i : idx) items.push_back((*obj.list)[static_cast<size_t>(i)]);
      return Value::from_list(std::move(items));
    }
    std::string s;
    for (int64_t i : idx) s.append(obj.text, offs[i], offs[i + 1] - offs[i]);
    return Value::from_string(std::move(s));
  }

  bool compare(Op op, const Value& a, const Value& b, int line) {
    switch (op) {
      case Op::kEq:
        return values_equal(a, b);
      case Op::kNe:
        return !values_equal(a, b);
      case Op::kLt:
        return compare_values(a, b, "<", line) < 0;
      case Op::kLe:
        return compare_values(a, b, "<=", line) <= 0;
      case Op::kGt:
        return compare_values(a, b, ">", line) > 0;
      case Op::kGe:
        return compare_values(a, b, ">=", line) >= 0;
      case Op::kIn:
        return contains(b, a, line);
      case Op::kNotIn:
        return !contains(b, a, line);
      default:
        return false;
    }
  }

  static bool contains(const Value& container, const Value& needle, int line) {
    switch (container.kind) {
      case Value::Kind::kString:
        if (!needle.is_string()) {
          fail(line,
               std::string("'in <string>' requires a string, not '") + type_name(needle) + "'");
        }
        return container.text.find(needle.text) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& v : *container.list) {
          if (values_equal(v, needle)) return true;
        }
        return false;
      case Value::Kind::kMap:
        return needle.is_string() && container.map->find(needle.text) != nullptr;
      case Value::Kind::kUndefined:
        return false;
      default:
        fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
    }
  }

  static Value binary(Op op, const Value& a, const Value& b, int line) {
    if (op == Op::kConcat) return Value::from_string(py_str(a) + py_str(b));
    if (a.is_undefined()) fail(line, undefined_message(a));
    if (b.is_undefined()) fail(line, undefined_message(b));
    static const char* const kSymbols[] = {"+", "-", "*", "/", "//", "%", "**"};
    const char* sym = kSymbols[static_cast<int>(op)];
    auto type_error = [&]() -> Value {
      fail(line, std::string("unsupported operand types for ") + sym + ": '" + type_name(a) +
                     "' and '" + type_name(b) + "'");
    };
    if (op == Op::kAdd) {
      if (a.is_string() && b.is_string()) return Value::from_string(a.text + b.text);
      if (a.is_list() && b.is_list()) {
        ValueList items = *a.list;
        items.insert(items.end(), b.list->begin(), b.list->end());
        return Value::from_list(std::move(items));
      }
    }
    if (op == Op::kMul) {
      const Value* seq =
          a.is_string() || a.is_list() ? &a : (b.is_string() || b.is_list() ? &b : nullptr);
      const Value* count = seq == &a ? &b : &a;
      if (seq && count->is_integral()) {
        const int64_t n = std::max<int64_t>(0, count->as_int());
        const size_t unit = seq->is_string() ? seq->text.size() : seq->list->size();
        if (unit * static_cast<size_t>(n) > kMaxOutputBytes) fail(line, "repetition too large");
        if (seq->is_string()) {
          std::string s;
          for (int64_t i = 0; i < n; ++i) s += seq->text;
          return Value::from_string(std::move(s));
        }
        ValueList items;
        for (int64_t i = 0; i < n; ++i)
          items.insert(items.end(), seq->list->begin(), seq->list->end());
        return Value::from_list(std::move(items));
      }
    }
    if (op == Op::kMod && a.is_string()) fail(line, "unsupported construct: '%' string formatting");
    if (!a.is_number() || !b.is_number()) return type_error();
    const bool ints = a.is_integral() && b.is_integral();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_double(), fy = b.as_double();
    int64_t r = 0;
    switch (op) {
      case Op::kAdd:
        if (!ints) return Value::from_float(fx + fy);
        if (__builtin_add_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kSub:
        if (!ints) return Value::from_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kMul:
        if (!ints) return Value::from_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &r)) fail(line, "integer overflow");
        return Value::from_int(r);
      case Op::kDiv:
        if (fy == 0) fail(line, "division by zero");
        return Value::from_float(fx / fy);
      case Op::kFloorDiv:
        if (fy == 0) fail(line, "division by zero");
        if (ints) {
          if (x == std::numeric_limits<int64_t>::min() && y == -1) fail(line, "integer overflow");
          int64_t q = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
          return Value::from_int(q);
        }
        return Value::from_float(std::floor(fx / fy));
      case Op::kMod:
        if (fy == 0) fail(line, "modulo by zero");
        if (ints) {
          if (y == -1) return Value::from_int(0);
          int64_t m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::from_int(m);
        } else {
          double m = std::fmod(fx, fy);
          if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
          return Value::from_float(m);
        }
      case Op::kPow:
        if (ints && y >= 0) {
          int64_t acc = 1;
          for (int64_t i = 0; i < y; ++i) {
            if (__builtin_mul_overflow(acc, x, &acc)) fail(line, "integer overflow");
            if (acc == 0 || acc == 1) break;
          }
          return Value::from_int(acc);
        }
        return Value::from_float(std::pow(fx, fy));
      default:
        return type_error();
    }
  }

  // --- calls ---

  Value call(const Expr& e) {
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::Kind::kGetAttr) {
      Value obj = eval(*callee.args[0]);
      if (!obj.is_map() || obj.map->find(callee.name) == nullptr ||
          obj.map->find(callee.name)->kind != Value::Kind::kCallable) {
        return call_method(obj, callee.name, eval_args(e, 1), e.line);
      }
    }
    Value fn = eval(callee);
    if (fn.is_undefined()) fail(e.line, undefined_message(fn) + " (called as a function)");
    if (fn.kind != Value::Kind::kCallable) {
      fail(e.line, std::string("'") + type_name(fn) + "' object is not callable");
    }
    CallArgs args = eval_args(e, 1);
    if (fn.callable->macro) return call_macro(*fn.callable->macro, args, e.line);
    return call_builtin(*fn.callable, args, e.line);
  }

  Value call_macro(const Node& macro, const CallArgs& args, int line) {
    if (args.positional.size() > macro.params.size()) {
      fail(line, "macro '" + macro.text + "' takes " + std::to_string(macro.params.size()) +
                     " arguments");
    }
    auto frame = std::make_shared<Scope>();
    for (size_t i = 0; i < macro.params.size(); ++i) {
      const Value* v = args.get(i, macro.params[i].c_str());
      if (v) {
        frame->insert_or_assign(macro.params[i], *v);
      } else if (macro.defaults[i]) {
        frame->insert_or_assign(macro.params[i], eval(*macro.defaults[i]));
      } else {
        frame->insert_or_assign(macro.params[i], Value::undefined(macro.params[i]));
      }
    }
    for (const auto& [k, v] : args.keyword) {
      if (std::find(macro.params.begin(), macro.params.end(), k) == macro.params.end()) {
        fail(line, "macro '" + macro.text + "' has no parameter '" + k + "'");
      }
    }
    DepthGuard guard(depth_, line);
    std::vector<std::shared_ptr<Scope>> saved = {scopes_.front(), frame};
    std::swap(saved, scopes_);
    const bool saved_break = break_, saved_continue = continue_;
    std::string out;
    render(macro.body, out);
    std::swap(saved, scopes_);
    break_ = saved_break;
    continue_ = saved_continue;
    return Value::from_string(std::move(out));
  }

  static Value call_builtin(const Callable& fn, const CallArgs& args, int line) {
    switch (fn.builtin) {
      case Builtin::kRaiseException: {
        const Value* msg = args.get(0, "message");
        fail(line, msg ? py_str(*msg) : std::string("raise_exception() called"));
      }
      case Builtin::kNamespace:
      case Builtin::kDict: {
        auto m = std::make_shared<ValueMap>();
        m->is_namespace = fn.builtin == Builtin::kNamespace;
        for (const Value& p : args.positional) {
          if (!p.is_map()) fail(line, fn.name + "() takes a dict or keyword arguments");
          for (const auto& [k, v] : p.map->items) m->set(k, v);
        }
        for (const auto& [k, v] : args.keyword) m->set(k, v);
        return Value::from_map(std::move(m));
      }
      case Builtin::kRange: {
        std::vector<int64_t> a;
        for (const Value& v : args.positional) {
          if (!v.is_integral()) fail(line, "range() arguments must be integers");
          a.push_back(v.as_int());
        }
        if (a.empty() || a.size() > 3) fail(line, "range() takes 1 to 3 arguments");
        const int64_t start = a.size() == 1 ? 0 : a[0];
        const int64_t stop = a.size() == 1 ? a[0] : a[1];
        const int64_t step = a.size() == 3 ? a[2] : 1;
        if (step == 0) fail(line, "range() step must not be zero");
        ValueList items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          if (static_cast<int64_t>(items.size()) >= kMaxRange) fail(line, "range() too large");
          items.push_back(Value::from_int(i));
        }
        return Value::from_list(std::move(items));
      }
      case Builtin::kStrftimeNow: {
        const Value* fmt = args.get(0, "format");
        if (!fmt || !fmt->is_string()) fail(line, "strftime_now() takes a format string");
        const std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[256];
        const size_t n = std::strftime(buf, sizeof(buf), fmt->text.c_str(), &tm);
        return Value::from_string(std::string(buf, n));
      }
    }
    return Value::none();
  }

  static std::string arg_string(const CallArgs& args, size_t i, const char* name, const char* fn,
                                int line) {
    const Value* v = args.get(i, name);
    if (!v || !v->is_string())
      fail(line, std::string(fn) + "() needs a string argument '" + name + "'");
    return v->text;
  }

  static ValueList python_split(const std::string& s, const Value* sep, int64_t maxsplit,
                                int line) {
    ValueList parts;
    if (!sep || sep->is_none()) {
      size_t i = 0;
      int64_t splits = 0;
      while (i < s.size()) {
        while (i < s.size() && is_ascii_space(s[i])) ++i;
        if (i >= s.size()) break;
        if (maxsplit >= 0 && splits == maxsplit) {
          size_t end = s.size();
          while (end > i && is_ascii_space(s[end - 1])) --end;
          parts.push_back(Value::from_string(s.substr(i, end - i)));
          break;
        }
        size_t j = i;
        while (j < s.size() && !is_ascii_space(s[j])) ++j;
        parts.push_back(Value::from_string(s.substr(i, j - i)));
        ++splits;
        i = j;
      }
      return parts;
    }
    if (!sep->is_string() || sep->text.empty())
      fail(line, "split() separator must be a non-empty string");
    size_t start = 0;
    int64_t splits = 0;
    for (;;) {
      const size_t at =
          (maxsplit >= 0 && splits == maxsplit) ? std::string::npos : s.find(sep->text, start);
      if (at == std::string::npos) {
        parts.push_back(Value::from_string(s.substr(start)));
        return parts;
      }
      parts.push_back(Value::from_string(s.substr(start, at - start)));
      start = at + sep->text.size();
      ++splits;
    }
  }

  static std::string ascii_case(std::string s, bool upper) {
    for (char& c : s)
      c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                  : std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  static std::string title_case(const std::string& s) {
    std::string out = s;
    bool prev_alpha = false;
    for (char& c : out) {
      const bool alpha = std::isalpha(static_cast<unsigned char>(c));
      if (alpha) c = static_cast<char>(prev_alpha ? std::tolower(c) : std::toupper(c));
      prev_alpha = alpha;
    }
    return out;
  }
  static std::string capitalize(const std::string& s) {
    std::string out = ascii_case(s, false);
    if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
    return out;
  }
  static std::string replace_all(const std::string& s, const std::string& from,
                                 const std::string& to, int64_t count) {
    if (from.empty()) return s;
    std::string out;
    size_t start = 0;
    for (int64_t n = 0; count < 0 || n < count; ++n) {
      const size_t at = s.find(from, start);
      if (at == std::string::npos) break;
      out.append(s, start, at - start);
      out += to;
      start = at + from.size();
    }
    out.append(s, start, std::string::npos);
    return out;
  }

  Value call_method(const Value& obj, const std::string& name, const CallArgs& args, int line) {
    if (obj.is_undefined()) {
      fail(line, undefined_message(obj) + " (cannot call its method '" + name + "')");
    }
    if (obj.is_string()) {
      const std::string& s = obj.text;
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const Value* chars = args.get(0, "chars");
        std::string set = chars && chars->is_string() ? chars->text : "";
        return Value::from_string(py_strip(s, chars && chars->is_string() ? &set : nullptr,
                                           name != "rstrip", name != "lstrip"));
      }
      if (name == "upper" || name == "lower")
        return Value::from_string(ascii_case(s, name == "upper"));
      if (name == "title") return Value::from_string(title_case(s));
      if (name == "capitalize") return Value::from_string(capitalize(s));
      if (name == "startswith" || name == "endswith") {
        const Value* arg = args.get(0, "prefix");
        if (!arg) fail(line, name + "() takes an argument");
        ValueList options = arg->is_list() ? *arg->list : ValueList{*arg};
        for (const Value& o : options) {
          if (!o.is_string()) fail(line, name + "() arguments must be strings");
          const std::string& t = o.text;
          const bool hit =
              name == "startswith"
                  ? s.compare(0, t.size(), t) == 0
                  : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
          if (hit) return Value::from_bool(true);
        }
        return Value::from_bool(false);
      }
      if (name == "split") {
        const Value* maxsplit = args.get(1, "maxsplit");
        return Value::from_list(
            python_split(s, args.get(0, "sep"),
                         maxsplit && maxsplit->is_integral() ? maxsplit->as_int() : -1, line));
      }
      if (name == "splitlines") {
        ValueList lines;
        size_t start = 0;
        for (size_t i = 0; i < s.size(); ++i) {
          if (s[i] == '\n' || s[i] == '\r') {
            lines.push_back(Value::from_string(s.substr(start, i - start)));
            if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
          }
        }
        if (start < s.size()) lines.push_back(Value::from_string(s.substr(start)));
        return Value::from_list(std::move(lines));
      }
      if (name == "replace") {
        const Value* count = args.get(2, "count");
        return Value::from_string(
            replace_all(s, arg_string(args, 0, "old", "replace", line),
                        arg_string(args, 1, "new", "replace", line),
                        count && count->is_integral() ? count->as_int() : -1));
      }
      if (name == "find" || name == "count") {
        const std::string sub = arg_string(args, 0, "sub", name.c_str(), line);
        if (name == "find") {
          const size_t at = s.find(sub);
          if (at == std::string::npos) return Value::from_int(-1);
          return Value::from_int(static_cast<int64_t>(code_point_offsets(s.substr(0, at)).size()) -
                                 1);
        }
        if (sub.empty()) return Value::from_int(static_cast<int64_t>(code_point_offsets(s).size()));
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size()))
          ++n;
        return Value::from_int(n);
      }
      if (name == "join") {
        const Value* items = args.get(0, "iterable");
        if (!items) fail(line, "join() takes an iterable");
        std::string out;
        bool first = true;
        for (const Value& v : iterate(*items, line)) {
          if (!v.is_string()) fail(line, "join() items must be strings");
          if (!first) out += s;
          first = false;
          out += v.text;
        }
        return Value::from_string(std::move(out));
      }
      if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
        if (s.empty()) return Value::from_bool(false);
        for (char c : s) {
          const auto u = static_cast<unsigned char>(c);
          const bool ok = name == "isdigit"   ? std::isdigit(u)
                          : name == "isspace" ? is_ascii_space(c)
                          : name == "isalpha" ? std::isalpha(u)
                                              : std::isalnum(u);
          if (!ok) return Value::from_bool(false);
        }
        return Value::from_bool(true);
      }
    } else if (obj.is_map() && !obj.map->is_namespace) {
      if (name == "items" || name == "keys" || name == "values") {
        ValueList out;
        for (const auto& [k, v] : obj.map->items) {
          if (name == "items") {
            out.push_back(Value::from_list({Value::from_string(k), v}, /*is_tuple=*/true));
          } else {
            out.push_back(name == "keys" ? Value::from_string(k) : v);
          }
        }
        return Value::from_list(std::move(out));
      }
      if (name == "get") {
        const Value* key = args.get(0, "key");
        const Value* dflt = args.get(1, "default");
        const Value* found = key && key->is_string() ? obj.map->find(key->text) : nullptr;
        return found ? *found : (dflt ? *dflt : Value::none());
      }
    }
    fail(line, std::string("unsupported method '") + name + "' on a value of type '" +
                   type_name(obj) + "'");
  }

  // --- filters and tests ---

  Value attribute_of(const Value& v, const std::string& path, int line) {
    Value cur = v;
    size_t start = 0;
    for (;;) {
      const size_t dot = path.find('.', start);
      const std::string part =
          path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c)) != 0;
      });
      if (numeric && cur.is_list()) {
        cur = get_item(cur, Value::from_int(std::stoll(part)), line);
      } else {
        cur = cur.is_undefined() ? cur : get_attr(cur, part, line);
      }
      if (dot == std::string::npos) return cur;
      start = dot + 1;
    }
  }

  Value apply_filter(const std::string& name, const Value& v, const CallArgs& args, int line) {
    if (name == "trim") {
      const Value* chars = args.get(0, "chars");
      std::string set = chars && chars->is_string() ? chars->text : "";
      return Value::from_string(
          py_strip(py_str(v), chars && chars->is_string() ? &set : nullptr, true, true));
    }
    if (name == "length" || name == "count") {
      switch (v.kind) {
        case Value::Kind::kUndefined:
          return Value::from_int(0);
        case Value::Kind::kString:
          return Value::from_int(static_cast<int64_t>(code_point_offsets(v.text).size()) - 1);
        case Value::Kind::kList:
          return Value::from_int(static_cast<int64_t>(v.list->size()));
        case Value::Kind::kMap:
          return Value::from_int(static_cast<int64_t>(v.map->items.size()));
        default:
          fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
      }
    }
    if (name == "string") return Value::from_string(py_str(v));
    if (name == "safe") return v;
    if (name == "e" || name == "escape") {
      std::string out;
      for (char c : py_str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::from_string(std::move(out));
    }
    if (name == "upper" || name == "lower")
      return Value::from_string(ascii_case(py_str(v), name == "upper"));
    if (name == "capitalize") return Value::from_string(capitalize(py_str(v)));
    if (name == "title") return Value::from_string(title_case(py_str(v)));
    if (name == "replace") {
      const Value* count = args.get(2, "count");
      return Value::from_string(replace_all(py_str(v), arg_string(args, 0, "old", "replace", line),
                                            arg_string(args, 1, "new", "replace", line),
                                            count && count->is_integral() ? count->as_int() : -1));
    }
    if (name == "default" || name == "d") {
      const Value* dflt = args.get(0, "default_value");
      const Value* boolean = args.get(1, "boolean");
      const bool use_default = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
      if (use_default) return dflt ? *dflt : Value::from_string("");
      return v;
    }
    if (name == "tojson") {
      JsonDumpOptions o;
      if (const Value* a = args.get(0, "ensure_ascii")) o.ensure_ascii = truthy(*a);
      if (const Value* ind = args.get(1, "indent"); ind && !ind->is_none()) {
        if (ind->is_integral()) {
          o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, ind->as_int())), ' ');
        } else if (ind->is_string()) {
          o.indent = ind->text;
        } else {
          fail(line, "tojson: indent must be an integer or a string");
        }
        o.item_separator = ",";
      }
      if (const Value* sep = args.get(2, "separators"); sep && !sep->is_none()) {
        if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_string() ||
            !(*sep->list)[1].is_string()) {
          fail(line, "tojson: separators must be a pair of strings");
        }
        o.item_separator = (*sep->list)[0].text;
        o.key_separator = (*sep->list)[1].text;
      }
      if (const Value* sk = args.get(3, "sort_keys")) o.sort_keys = truthy(*sk);
      std::string out;
      dump_json(v, o, 0, out, line);
      return Value::from_string(std::move(out));
    }
    if (name == "abs") {
      if (v.kind == Value::Kind::kFloat) return Value::from_float(std::fabs(v.number));
      if (v.is_integral()) return Value::from_int(std::llabs(v.as_int()));
      fail(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    }
    if (name == "int" || name == "float") {
      const Value* dflt = args.get(0, "default");
      const bool to_int = name == "int";
      if (v.is_number())
        return to_int ? Value::from_int(static_cast<int64_t>(v.as_double()))
                      : Value::from_float(v.as_double());
      if (v.is_string()) {
        const std::string t = py_strip(v.text, nullptr, true, true);
        char* end = nullptr;
        if (to_int) {
          const long long i = std::strtoll(t.c_str(), &end, 10);
          if (!t.empty() && end && *end == '\0') return Value::from_int(i);
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end && *end == '\0') return Value::from_int(static_cast<int64_t>(d));
        } else {
          const double d = std::strtod(t.c_str(), &end);
          if (!t.empty() && end && *end == '\0') return Value::from_float(d);
        }
      }
      if (dflt) return *dflt;
      return to_int ? Value::from_int(0) : Value::from_float(0.0);
    }
    if (name == "round") {
      if (!v.is_number()) fail(line, "round: not a number");
      const Value* prec = args.get(0, "precision");
      const double scale =
          std::pow(10.0, prec && prec->is_integral() ? static_cast<double>(prec->as_int()) : 0.0);
      return Value::from_float(std::nearbyint(v.as_double() * scale) / scale);
    }
    if (name == "wordcount")
      return Value::from_int(
          static_cast<int64_t>(python_split(py_str(v), nullptr, -1, line).size()));
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string pad =
          width && width->is_string()
              ? width->text
              : std::string(width && width->is_integral()
                                ? static_cast<size_t>(std::max<int64_t>(0, width->as_int()))
                                : 4,
                            ' ');
      const std::string s = py_str(v);
      std::string out;
      size_t start = 0;
      bool first_line = true;
      for (;;) {
        const size_t nl = s.find('\n', start);
        const std::string ln =
            s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
        const bool is_blank = py_strip(ln, nullptr, true, true).empty();
        if ((first_line ? (first && truthy(*first)) : true) &&
            (!is_blank || (blank && truthy(*blank))))
          out += pad;
        out += ln;
        if (nl == std::string::npos) break;
        out += '\n';
        start = nl + 1;
        first_line = false;
      }
      return Value::from_string(std::move(out));
    }
    if (name == "items") {
      if (v.is_undefined()) return Value::from_list({});
      if (!v.is_map()) fail(line, "items: value is not a dict");
      return call_method(v, "items", {}, line);
    }
    if (name == "dictsort") {
      if (!v.is_map()) fail(line, "dictsort: value is not a dict");
      std::vector<std::pair<std::string, Value>> items = v.map->items;
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      ValueList out;
      for (auto& [k, item] : items) {
        out.push_back(Value::from_list({Value::from_string(k), item}, /*is_tuple=*/true));
      }
      return Value::from_list(std::move(out));
    }

    // Filters over sequences.
    ValueList items = iterate(v, line);
    if (name == "list") return Value::from_list(std::move(items));
    if (name == "first" || name == "last") {
      if (items.empty()) return Value::undefined(name);
      return name == "first" ? items.front() : items.back();
    }
    if (name == "reverse") {
      if (v.is_string()) {
        std::string s;
        for (auto it = items.rbegin(); it != items.rend(); ++it) s += it->text;
        return Value::from_string(std::move(s));
      }
      std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      const Value* attr = args.get(1, "attribute");
      std::string out;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i && sep) out += py_str(*sep);
        out += py_str(attr ? attribute_of(items[i], py_str(*attr), line) : items[i]);
      }
      return Value::from_string(std::move(out));
    }
    if (name == "select" || name == "reject") {
      const Value* test = args.get(0, "test");
      CallArgs test_args;
      test_args.positional.assign(
          args.positional.begin() + std::min<size_t>(1, args.positional.size()),
          args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        const bool hit = test ? apply_test(py_str(*test), item, test_args, line) : truthy(item);
        if (hit == (name == "select")) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "selectattr" || name == "rejectattr") {
      const Value* attr = args.get(0, "attribute");
      if (!attr || !attr->is_string()) fail(line, name + " needs an attribute name");
      const Value* test = args.get(1, "test");
      CallArgs test_args;
      if (args.positional.size() > 2)
        test_args.positional.assign(args.positional.begin() + 2, args.positional.end());
      ValueList out;
      for (const Value& item : items) {
        const Value field = attribute_of(item, attr->text, line);
        const bool hit = test ? apply_test(py_str(*test), field, test_args, line) : truthy(field);
        if (hit == (name == "selectattr")) out.push_back(item);
      }
      return Value::from_list(std::move(out));
    }
    if (name == "map") {
      ValueList out;
      for (const auto& [k, kv] : args.keyword) {
        if (k == "attribute") {
          const Value* dflt = nullptr;
          for (const auto& [dk, dv] : args.keyword) {
            if (dk == "default") dflt = &dv;
          }
          for (const Value& item : items) {
            Value field = attribute_of(item, py_str(kv), line);
            out.push_back(field.is_undefined() && dflt ? *dflt : field);
          }
          return Value::from_list(std::move(out));
        }
      }
      const Value* filter = args.get(0, "filter");
      if (!filter || !filter->is_string()) fail(line, "map needs a filter name or attribute=");
      if (!supported_filters().count(filter->text))
        fail(line, "unsupported filter '" + filter->text + "'");
      CallArgs rest;
      rest.positional.assign(args.positional.begin() + 1, args.positional.end());
      for (const Value& item : items) out.push_back(apply_filter(filter->text, item, rest, line));
      return Value::from_list(std::move(out));
    }
    if (name == "unique") {
      ValueList out;
      for (const Value& item : items) {
        if (std::none_of(out.begin(), out.end(),
                         [&](const Value& o) { return values_equal(o, item); })) {
          out.push_back(item);
        }
      }
      return Value::from_list(std::move(out));
    }
    if (name == "sort" || name == "min" || name == "max") {
      const Value* reverse = name == "sort" ? args.get(0, "reverse") : nullptr;
      const Value* attr = args.get(name == "sort" ? 2 : 1, "attribute");
      auto key = [&](const Value& item) {
        return attr ? attribute_of(item, py_str(*attr), line) : item;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
        return compare_values(key(a), key(b), "<", line) < 0;
      });
      if (name == "min") return items.empty() ? Value::undefined("min") : items.front();
      if (name == "max") return items.empty() ? Value::undefined("max") : items.back();
      if (reverse && truthy(*reverse)) std::reverse(items.begin(), items.end());
      return Value::from_list(std::move(items));
    }
    if (name == "sum") {
      Value acc = Value::from_int(0);
      const Value* attr = args.get(0, "attribute");
      for (const Value& item : items)
        acc = binary(Op::kAdd, acc, attr ? attribute_of(item, py_str(*attr), line) : item, line);
      return acc;
    }
    fail(line, "unsupported filter '" + name + "'");
  }

  bool apply_test(const std::string& name, const Value& v, const CallArgs& args, int line) {
    auto arg = [&]() -> const Value& {
      const Value* a = args.get(0, "other");
      if (!a) fail(line, "test '" + name + "' needs an argument");
      return *a;
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "boolean") return v.kind == Value::Kind::kBool;
    if (name == "true") return v.kind == Value::Kind::kBool && v.boolean;
    if (name == "false") return v.kind == Value::Kind::kBool && !v.boolean;
    if (name == "integer") return v.kind == Value::Kind::kInt;
    if (name == "float") return v.kind == Value::Kind::kFloat;
    if (name == "number") return v.is_number();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_map() && !v.map->is_namespace;
    if (name == "iterable")
      return v.is_string() || v.is_list() || (v.is_map() && !v.map->is_namespace);
    if (name == "sequence")
      return v.is_string() || v.is_list() || (v.is_map() && !v.map->is_namespace);
    if (name == "callable") return v.kind == Value::Kind::kCallable;
    if (name == "escaped") return false;
    if (name == "lower" || name == "upper") {
      return v.is_string() && ascii_case(v.text, name == "upper") == v.text;
    }
    if (name == "even" || name == "odd" || name == "divisibleby") {
      if (!v.is_integral()) fail(line, "test '" + name + "' needs an integer");
      const int64_t d = name == "divisibleby" ? (arg().is_integral() ? arg().as_int() : 0) : 2;
      if (d == 0) fail(line, "divisibleby: divisor must be a non-zero integer");
      const bool divisible = v.as_int() % d == 0;
      return name == "odd" ? !divisible : divisible;
    }
    if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, arg());
    if (name == "ne" || name == "!=") return !values_equal(v, arg());
    if (name == "lt" || name == "lessthan" || name == "<")
      return compare_values(v, arg(), "<", line) < 0;
    if (name == "le" || name == "<=") return compare_values(v, arg(), "<=", line) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">")
      return compare_values(v, arg(), ">", line) > 0;
    if (name == "ge" || name == ">=") return compare_values(v, arg(), ">=", line) >= 0;
    if (name == "in") return contains(arg(), v, line);
    if (name == "sameas") {
      const Value& o = arg();
      if (v.kind != o.kind) return false;
      if (v.is_none() || v.is_undefined()) return true;
      if (v.kind == Value::Kind::kBool) return v.boolean == o.boolean;
      if (v.is_map()) return v.map == o.map;
      if (v.is_list()) return v.list == o.list;
      return values_equal(v, o);
    }
    fail(line, "unsupported test '" + name + "'");
  }

  const Scope& globals_;
  std::vector<std::shared_ptr<Scope>> scopes_;
  std::string* out_ = nullptr;
  bool break_ = false;
  bool continue_ = false;
  int depth_ = 0;
};

const Scope& builtin_globals() {
  static const Scope globals = [] {
    Scope g;
    auto add = [&](const char* name, Builtin b) {
      Callable c;
      c.name = name;
      c.builtin = b;
      g.emplace(name, Value::from_callable(std::move(c)));
    };
    add("raise_exception", Builtin::kRaiseException);
    add("namespace", Builtin::kNamespace);
    add("range", Builtin::kRange);
    add("strftime_now", Builtin::kStrftimeNow);
    add("dict", Builtin::kDict);
    return g;
  }();
  return globals;
}

}  // namespace

void render_template(const NodeList& nodes, std::shared_ptr<Scope> root, std::string& out) {
  Renderer(std::move(root), builtin_globals()).render(nodes, out);
}

}  // namespace qs::chat_template_internal
