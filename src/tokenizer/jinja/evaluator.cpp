#include "tokenizer/jinja/evaluator.hpp"

#include <cmath>

#include "deepfuse/error.hpp"
#include "tokenizer/jinja/builtins.hpp"

namespace deepfuse::jinja {
namespace {

// Python's floor division and modulo (the result takes the divisor's sign).
int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "+" && a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
  if (op == "+" && a.is_list() && b.is_list()) {
    ValueList joined = a.as_list();
    joined.insert(joined.end(), b.as_list().begin(), b.as_list().end());
    return Value(std::move(joined));
  }
  if (op == "*" && a.is_string() && b.kind() == Value::Kind::Int) {
    std::string repeated;
    for (int64_t i = 0; i < b.as_int(); ++i) repeated += a.as_string();
    return Value(std::move(repeated));
  }
  const auto numeric = [](const Value& v) { return v.is_number() || v.kind() == Value::Kind::Bool; };
  if (!numeric(a) || !numeric(b))
    fail_at(std::string("unsupported operand types for ") + op + ": " + a.type_name() + " and " + b.type_name(), line);
  const bool floats = a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float;
  if (op == "/") {
    if (b.as_double() == 0) fail_at("division by zero", line);
    return Value(a.as_double() / b.as_double());
  }
  if (floats) {
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**") return Value(std::pow(x, y));
    if (y == 0) fail_at("division by zero", line);
    if (op == "//") return Value(std::floor(x / y));
    return Value(x - y * std::floor(x / y));  // %
  }
  const int64_t x = a.as_int(), y = b.as_int();
  if (op == "+") return Value(x + y);
  if (op == "-") return Value(x - y);
  if (op == "*") return Value(x * y);
  if (op == "**") {
    if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
    int64_t result = 1;
    for (int64_t i = 0; i < y; ++i) result *= x;
    return Value(result);
  }
  if (y == 0) fail_at("division by zero", line);
  if (op == "//") return Value(floor_div(x, y));
  return Value(x - y * floor_div(x, y));  // %
}

bool contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) fail_at("'in <string>' needs a string on the left", line);
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_dict()) return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
  if (container.is_list()) {
    for (const Value& element : container.as_list())
      if (element == item) return true;
    return false;
  }
  if (container.is_undefined()) return false;
  fail_at(std::string("'in' needs a string, list or dict, not ") + container.type_name(), line);
}

}  // namespace

Evaluator::Evaluator(const ValueDict& context) {
  scopes_.emplace_back();
  for (const auto& [name, value] : global_functions().entries) scopes_.back()[name] = value;
  for (const auto& [name, value] : context.entries) scopes_.back()[name] = value;
}

std::string Evaluator::render(const Body& body) {
  std::string out;
  exec(body, out);
  return out;
}

Value Evaluator::lookup(const std::string& name) const {
  for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope)
    if (const auto it = scope->find(name); it != scope->end()) return it->second;
  return Value();
}

Evaluator::Flow Evaluator::exec(const Body& body, std::string& out) {
  for (const auto& stmt : body) {
    switch (stmt->kind) {
      case Stmt::Kind::Text: out += stmt->text; break;
      case Stmt::Kind::Output: out += eval(*stmt->expr).to_string(); break;
      case Stmt::Kind::If: {
        size_t branch = 0;
        while (branch < stmt->conditions.size() && stmt->conditions[branch] && !eval(*stmt->conditions[branch]).truthy()) ++branch;
        if (branch < stmt->bodies.size()) {
          const Flow flow = exec(stmt->bodies[branch], out);
          if (flow != Flow::Normal) return flow;
        }
        break;
      }
      case Stmt::Kind::For: {
        const Flow flow = exec_for(*stmt, out);
        if (flow != Flow::Normal) return flow;
        break;
      }
      case Stmt::Kind::Set: exec_set(*stmt, eval(*stmt->expr)); break;
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec(stmt->bodies[0], captured);
        exec_set(*stmt, Value(std::move(captured)));
        break;
      }
      case Stmt::Kind::Break: return Flow::Break;
      case Stmt::Kind::Continue: return Flow::Continue;
    }
  }
  return Flow::Normal;
}

void Evaluator::exec_set(const Stmt& stmt, Value value) {
  const std::string& name = stmt.targets[0];
  if (stmt.attribute.empty()) {
    scopes_.back()[name] = std::move(value);
    return;
  }
  const Value target = lookup(name);
  if (!target.is_namespace()) fail_at("{% set " + name + "." + stmt.attribute + " %} needs a namespace() object", stmt.line);
  target.mutable_dict().set(stmt.attribute, std::move(value));
}

Evaluator::Flow Evaluator::exec_for(const Stmt& stmt, std::string& out) {
  const Value iterable = eval(*stmt.expr);
  ValueList items = iterable.is_dict() && stmt.targets.size() == 2 ? get_member(iterable, "items", stmt.line).as_function()(CallArgs{}).as_list()
                                                                   : iterable.iterate();
  const auto bind_targets = [&](std::unordered_map<std::string, Value>& scope, const Value& item) {
    if (stmt.targets.size() == 1) {
      scope[stmt.targets[0]] = item;
      return;
    }
    if (!item.is_list() || item.as_list().size() != stmt.targets.size())
      fail_at("cannot unpack a " + std::string(item.type_name()) + " into " + std::to_string(stmt.targets.size()) + " loop variables", stmt.line);
    for (size_t i = 0; i < stmt.targets.size(); ++i) scope[stmt.targets[i]] = item.as_list()[i];
  };
  if (stmt.loop_filter) {  // `for x in xs if cond`: filtered before loop.index and friends count
    ValueList kept;
    for (const Value& item : items) {
      scopes_.emplace_back();
      bind_targets(scopes_.back(), item);
      const bool keep = eval(*stmt.loop_filter).truthy();
      scopes_.pop_back();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (stmt.bodies.size() > 1) return exec(stmt.bodies[1], out);
    return Flow::Normal;
  }
  const auto count = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < count; ++i) {
    scopes_.emplace_back();
    bind_targets(scopes_.back(), items[i]);
    ValueDict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(count - i));
    loop.set("revindex0", Value(count - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == count - 1));
    loop.set("length", Value(count));
    loop.set("previtem", i > 0 ? items[i - 1] : Value());
    loop.set("nextitem", i + 1 < count ? items[i + 1] : Value());
    scopes_.back()["loop"] = Value(std::move(loop));
    const Flow flow = exec(stmt.bodies[0], out);
    scopes_.pop_back();
    if (flow == Flow::Break) break;
  }
  return Flow::Normal;
}

CallArgs Evaluator::eval_arguments(const Arguments& arguments) {
  CallArgs args;
  for (const auto& expr : arguments.positional) args.positional.push_back(eval(*expr));
  for (const auto& [name, expr] : arguments.keyword) args.keyword.emplace_back(name, eval(*expr));
  return args;
}

Value Evaluator::eval_call(const Expr& expr) {
  const Value callee = eval(*expr.object);
  if (callee.kind() != Value::Kind::Function) {
    const std::string what = expr.object->kind == Expr::Kind::Name        ? "'" + expr.object->name + "'"
                             : expr.object->kind == Expr::Kind::Attribute ? "method '" + expr.object->name + "'"
                                                                          : "this value";
    fail_at(what + " is not a supported function", expr.line);
  }
  return callee.as_function()(eval_arguments(expr.arguments));
}

Value Evaluator::eval_binary(const Expr& expr) {
  const std::string& op = expr.name;
  if (op == "and") {
    Value left = eval(*expr.left);
    return left.truthy() ? eval(*expr.right) : left;
  }
  if (op == "or") {
    Value left = eval(*expr.left);
    return left.truthy() ? left : eval(*expr.right);
  }
  const Value left = eval(*expr.left), right = eval(*expr.right);
  if (op == "==") return Value(left == right);
  if (op == "!=") return Value(!(left == right));
  if (op == "in") return Value(contains(right, left, expr.line));
  if (op == "not in") return Value(!contains(right, left, expr.line));
  if (op == "~") return Value(left.to_string() + right.to_string());
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    CallArgs args;
    args.positional.push_back(right);
    const bool less = apply_test("lt", left, args, expr.line);
    const bool equal = left == right;
    if (op == "<") return Value(less);
    if (op == "<=") return Value(less || equal);
    if (op == ">") return Value(!less && !equal);
    return Value(!less);
  }
  return arithmetic(op, left, right, expr.line);
}

Value Evaluator::eval(const Expr& expr) {
  switch (expr.kind) {
    case Expr::Kind::Literal: return expr.value;
    case Expr::Kind::Name: return lookup(expr.name);
    case Expr::Kind::ListLiteral: {
      ValueList items;
      for (const auto& item : expr.items) items.push_back(eval(*item));
      return Value(std::move(items));
    }
    case Expr::Kind::DictLiteral: {
      ValueDict dict;
      for (size_t i = 0; i < expr.keys.size(); ++i) {
        const Value key = eval(*expr.keys[i]);
        if (!key.is_string()) fail_at("dict literal keys must be strings here", expr.line);
        dict.set(key.as_string(), eval(*expr.items[i]));
      }
      return Value(std::move(dict));
    }
    case Expr::Kind::Attribute: return get_member(eval(*expr.object), expr.name, expr.line);
    case Expr::Kind::Subscript: return get_item(eval(*expr.object), eval(*expr.items[0]), expr.line);
    case Expr::Kind::Slice: {
      const auto part = [&](size_t i) { return expr.items[i] ? eval(*expr.items[i]) : Value::none(); };
      return get_slice(eval(*expr.object), part(0), part(1), part(2), expr.line);
    }
    case Expr::Kind::Call: return eval_call(expr);
    case Expr::Kind::Filter: return apply_filter(expr.name, eval(*expr.object), eval_arguments(expr.arguments), expr.line);
    case Expr::Kind::Test: {
      const bool passed = apply_test(expr.name, eval(*expr.object), eval_arguments(expr.arguments), expr.line);
      return Value(passed != expr.negated);
    }
    case Expr::Kind::Unary: {
      const Value operand = eval(*expr.object);
      if (expr.name == "not") return Value(!operand.truthy());
      if (expr.name == "-") return operand.kind() == Value::Kind::Float ? Value(-operand.as_double()) : Value(-operand.as_int());
      return operand;
    }
    case Expr::Kind::Binary: return eval_binary(expr);
    case Expr::Kind::Conditional:
      return eval(*expr.items[1]).truthy() ? eval(*expr.items[0]) : eval(*expr.items[2]);
  }
  return Value();
}

}  // namespace deepfuse::jinja
