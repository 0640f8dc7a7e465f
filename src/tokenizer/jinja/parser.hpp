// Recursive-descent parser for the Jinja subset, with Jinja's operator precedence:
//   x if c else y  <  or  <  and  <  not  <  comparisons, in  <  + -  <  ~  <  * / // %  <  **
//   <  unary -  <  primary with .attr [index] (call), then | filters and `is` tests.
// Statements: if/elif/else, for (with tuple targets, `if` filter, else), set (name, ns.attr,
// block form), break, continue, and transformers' {% generation %} block. Anything else (macro,
// call, include, extends, ...) is an error naming the construct.
#pragma once

#include <vector>

#include "tokenizer/jinja/ast.hpp"
#include "tokenizer/jinja/lexer.hpp"

namespace deepfuse::jinja {

Body parse_template(const std::vector<Token>& tokens);

}  // namespace deepfuse::jinja
