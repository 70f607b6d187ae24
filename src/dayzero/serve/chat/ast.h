#pragma once
// The syntax tree of a parsed template. Nodes are owned by their parent; the Template owns
// the root list.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dayzero/serve/chat/value.h"

namespace dz::serve::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind : uint8_t {
    kLiteral,    // literal
    kName,       // name
    kList,       // args = items
    kTuple,      // args = items
    kDict,       // kwargs-like pairs: args = keys and values interleaved
    kAttr,       // args[0].name
    kSubscript,  // args[0][args[1]]
    kSlice,      // args[0][args[1]:args[2]:args[3]] (null entries where absent)
    kCall,       // args[0](args[1:], kwargs)
    kFilter,     // args[0] | name(args[1:], kwargs)
    kTest,       // args[0] is [not] name(args[1:])
    kUnary,      // name in {not, -, +}
    kBinary,     // name is the operator; args[0], args[1]
    kCondition,  // args[1] if args[0] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string name;
  Value literal;
  bool negated = false;
  int depth = 1;  // height of this subtree, bounded by the parser
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind : uint8_t {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // conditions[i] guards bodies[i]; bodies.back() is the else branch when
              // bodies.size() > conditions.size()
    kFor,     // for names in expr [if filter]: bodies[0], else bodies[1]
    kSet,     // set names (or names[0].attr when attr is set) = expr, or block form bodies[0]
    kMacro,   // macro text(params) with defaults: bodies[0]
    kBreak,
    kContinue,
    kBlock,  // a transparent block ({% generation %}): bodies[0]
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  std::string attr;
  std::vector<std::string> names;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters and their defaults
};

}  // namespace dz::serve::chat
