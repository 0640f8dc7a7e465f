// Syntax tree of the Jinja subset: expressions and statements, each remembering its line.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.hpp"

namespace deepfuse::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arguments {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keyword;
};

struct Expr {
  enum class Kind {
    Literal,      // value
    Name,         // name
    ListLiteral,  // items
    DictLiteral,  // keys/items pairs
    Attribute,    // object.name
    Subscript,    // object[items[0]]
    Slice,        // object[a:b:c]; missing parts are null
    Call,         // object(arguments)
    Filter,       // object | name(arguments)
    Test,         // object is [not] name(arguments)
    Unary,        // op object      (op: "not", "-", "+")
    Binary,       // left op right  (and or == != < <= > >= in "not in" + - * / // % ** ~)
    Conditional,  // items[0] if items[1] else items[2]
  };
  Kind kind;
  int line = 0;
  Value value;
  std::string name;  // Name, Attribute, Filter, Test; the operator of Unary/Binary
  bool negated = false;
  ExprPtr object, left, right;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  Arguments arguments;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind { Text, Output, If, For, Set, SetBlock, Break, Continue };
  Kind kind;
  int line = 0;
  std::string text;  // Text
  ExprPtr expr;      // Output, Set value, For iterable
  // If: conditions[i] guards bodies[i]; a trailing extra body is the else branch.
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  // For: loop variables, optional filter, body = bodies[0], else body = bodies[1] when present.
  std::vector<std::string> targets;
  ExprPtr loop_filter;
  // Set: targets[0] is the name; attribute, when not empty, makes it `set name.attribute = ...`.
  std::string attribute;
};

}  // namespace deepfuse::jinja
