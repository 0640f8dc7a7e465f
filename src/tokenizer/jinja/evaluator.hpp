// Renders a parsed template: statements write to the output, expressions evaluate to Values.
// Scoping follows Jinja: a for loop body gets its own scope (so `set` inside a loop does not
// leak out, which is why templates use namespace()), if blocks do not.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.hpp"

namespace deepfuse::jinja {

class Evaluator {
 public:
  explicit Evaluator(const ValueDict& context);
  std::string render(const Body& body);

 private:
  enum class Flow { Normal, Break, Continue };
  Flow exec(const Body& body, std::string& out);
  Flow exec_for(const Stmt& stmt, std::string& out);
  void exec_set(const Stmt& stmt, Value value);

  Value eval(const Expr& expr);
  Value eval_binary(const Expr& expr);
  Value eval_call(const Expr& expr);
  CallArgs eval_arguments(const Arguments& arguments);

  Value lookup(const std::string& name) const;
  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

}  // namespace deepfuse::jinja
