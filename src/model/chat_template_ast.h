// Chat-template AST: expressions and statement nodes built by the parser, walked by the renderer.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "model/chat_template_value.h"

namespace qs::chat_template_internal {

// ------------------------------------------------------------------------------------------------
// AST
// ------------------------------------------------------------------------------------------------

enum class Op {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
  kAnd,
  kOr,
  kNot,
  kNeg,
  kPos,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,
    kList,
    kDict,
    kGetAttr,
    kGetItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kUnary,
    kBinary,
    kCompare,
    kCondition,
  };
  Kind kind;
  int line = 0;
  Value literal;                // kLiteral
  std::string name;             // kName / kGetAttr attribute / kFilter, kTest name
  Op op = Op::kAdd;             // kUnary, kBinary
  bool negated = false;         // kTest: "is not"
  bool tuple = false;           // kList: written as a tuple
  std::vector<ExprPtr> args;    // operands, items, callee+arguments, subject+arguments
  std::vector<Op> compare_ops;  // kCompare: args[0] ops[0] args[1] ops[1] args[2] ...
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetAttr,
    kSetBlock,
    kBreak,
    kContinue,
    kMacro,
    kGeneration
  };
  Kind kind;
  int line = 0;
  std::string text;                                    // kText
  ExprPtr expr;                                        // kOutput, kSet*, kFor iterable
  std::vector<std::pair<ExprPtr, NodeList>> branches;  // kIf: (condition, body) for if / elif
  NodeList body;                                       // kFor, kSetBlock, kMacro, kGeneration
  NodeList else_body;                                  // kIf, kFor
  std::vector<std::string> targets;                    // kFor / kSet names; kSetAttr {ns, attr}
  ExprPtr filter;                                      // kFor "if" filter
  std::vector<std::string> params;                     // kMacro
  std::vector<ExprPtr> defaults;                       // kMacro (nullptr: no default)
};

// The filter and test names the renderer implements (defined in chat_template_parser.cpp).
const std::set<std::string>& supported_filters();
const std::set<std::string>& supported_tests();

}  // namespace qs::chat_template_internal
