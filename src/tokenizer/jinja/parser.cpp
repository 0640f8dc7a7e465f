#include "tokenizer/jinja/parser.hpp"

#include <set>

#include "deepfuse/error.hpp"

namespace deepfuse::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Body parse_all() {
    std::string end_tag;
    Body body = parse_body({}, end_tag);
    if (!end_tag.empty()) fail("unexpected {% " + end_tag + " %}");
    return body;
  }

 private:
  [[noreturn]] void fail(const std::string& message) const {
    throw Error("chat template: " + message + " (line " + std::to_string(peek().line) + ")");
  }
  const Token& peek(size_t ahead = 0) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_operator(const char* op) const { return peek().kind == TokenKind::Operator && peek().text == op; }
  bool at_name(const char* name) const { return peek().kind == TokenKind::Name && peek().text == name; }
  bool accept_operator(const char* op) {
    if (!at_operator(op)) return false;
    ++pos_;
    return true;
  }
  bool accept_name(const char* name) {
    if (!at_name(name)) return false;
    ++pos_;
    return true;
  }
  void expect_operator(const char* op) {
    if (!accept_operator(op)) fail(std::string("expected '") + op + "', found '" + peek().text + "'");
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::Name) fail("expected a name, found '" + peek().text + "'");
    return next().text;
  }
  void expect_block_close() {
    if (peek().kind != TokenKind::BlockClose) fail("expected '%}', found '" + peek().text + "'");
    ++pos_;
  }

  ExprPtr make(Expr::Kind kind) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = peek().line;
    return expr;
  }
  ExprPtr make_binary(std::string op, ExprPtr left, ExprPtr right) {
    ExprPtr expr = make(Expr::Kind::Binary);
    expr->name = std::move(op);
    expr->left = std::move(left);
    expr->right = std::move(right);
    return expr;
  }

  // ---- statements ----

  // Parses until one of `end_tags` opens a block; its name is left in `end_tag` (the tag's
  // remaining tokens are for the caller), or "" at the end of the template.
  Body parse_body(const std::set<std::string>& end_tags, std::string& end_tag) {
    Body body;
    while (true) {
      const Token& token = peek();
      if (token.kind == TokenKind::End) {
        end_tag.clear();
        return body;
      }
      if (token.kind == TokenKind::Text) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::Text;
        stmt->line = token.line;
        stmt->text = next().text;
        body.push_back(std::move(stmt));
      } else if (token.kind == TokenKind::VariableOpen) {
        ++pos_;
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::Output;
        stmt->line = token.line;
        stmt->expr = parse_expression();
        if (peek().kind != TokenKind::VariableClose) fail("expected '}}', found '" + peek().text + "'");
        ++pos_;
        body.push_back(std::move(stmt));
      } else if (token.kind == TokenKind::BlockOpen) {
        const std::string tag = peek(1).text;
        if (end_tags.count(tag)) {
          pos_ += 2;
          end_tag = tag;
          return body;
        }
        ++pos_;
        if (auto stmt = parse_statement()) body.push_back(std::move(stmt));
      } else {
        fail("unexpected '" + token.text + "'");
      }
    }
  }

  std::unique_ptr<Stmt> parse_statement() {
    auto stmt = std::make_unique<Stmt>();
    stmt->line = peek().line;
    const std::string tag = expect_name();
    if (tag == "if") return parse_if(std::move(stmt));
    if (tag == "for") return parse_for(std::move(stmt));
    if (tag == "set") return parse_set(std::move(stmt));
    if (tag == "break" || tag == "continue") {
      stmt->kind = tag == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_close();
      return stmt;
    }
    if (tag == "generation") {  // transformers' marker for assistant masks: renders its body
      expect_block_close();
      std::string end_tag;
      Body body = parse_body({"endgeneration"}, end_tag);
      if (end_tag.empty()) fail("{% generation %} without {% endgeneration %}");
      expect_block_close();
      stmt->kind = Stmt::Kind::If;
      stmt->conditions.push_back(nullptr);
      stmt->bodies.push_back(std::move(body));
      return stmt;
    }
    fail("unsupported construct '{% " + tag + " %}'");
  }

  std::unique_ptr<Stmt> parse_if(std::unique_ptr<Stmt> stmt) {
    stmt->kind = Stmt::Kind::If;
    stmt->conditions.push_back(parse_expression());
    expect_block_close();
    while (true) {
      std::string end_tag;
      stmt->bodies.push_back(parse_body({"elif", "else", "endif"}, end_tag));
      if (end_tag.empty()) fail("{% if %} without {% endif %}");
      if (end_tag == "elif") {
        stmt->conditions.push_back(parse_expression());
        expect_block_close();
      } else if (end_tag == "else") {
        expect_block_close();
        stmt->bodies.push_back(parse_body({"endif"}, end_tag));
        if (end_tag.empty()) fail("{% if %} without {% endif %}");
        expect_block_close();
        return stmt;
      } else {
        expect_block_close();
        return stmt;
      }
    }
  }

  std::unique_ptr<Stmt> parse_for(std::unique_ptr<Stmt> stmt) {
    stmt->kind = Stmt::Kind::For;
    do stmt->targets.push_back(expect_name());
    while (accept_operator(","));
    if (!accept_name("in")) fail("expected 'in' in {% for %}");
    stmt->expr = parse_or();  // no inline if here: a trailing `if` filters the loop
    if (accept_name("if")) stmt->loop_filter = parse_or();
    if (accept_name("recursive")) fail("unsupported construct 'recursive' loops");
    expect_block_close();
    std::string end_tag;
    stmt->bodies.push_back(parse_body({"else", "endfor"}, end_tag));
    if (end_tag.empty()) fail("{% for %} without {% endfor %}");
    expect_block_close();
    if (end_tag == "else") {
      stmt->bodies.push_back(parse_body({"endfor"}, end_tag));
      if (end_tag.empty()) fail("{% for %} without {% endfor %}");
      expect_block_close();
    }
    return stmt;
  }

  std::unique_ptr<Stmt> parse_set(std::unique_ptr<Stmt> stmt) {
    stmt->targets.push_back(expect_name());
    if (accept_operator(".")) stmt->attribute = expect_name();
    if (at_operator(",")) fail("unsupported construct: tuple unpacking in {% set %}");
    if (accept_operator("=")) {
      stmt->kind = Stmt::Kind::Set;
      stmt->expr = parse_expression();
      expect_block_close();
      return stmt;
    }
    if (!stmt->attribute.empty()) fail("block {% set %} needs a plain name");
    stmt->kind = Stmt::Kind::SetBlock;
    expect_block_close();
    std::string end_tag;
    stmt->bodies.push_back(parse_body({"endset"}, end_tag));
    if (end_tag.empty()) fail("{% set %} without {% endset %}");
    expect_block_close();
    return stmt;
  }

  // ---- expressions ----

  ExprPtr parse_expression() {
    ExprPtr value = parse_or();
    if (!accept_name("if")) return value;
    ExprPtr expr = make(Expr::Kind::Conditional);
    expr->items.push_back(std::move(value));
    expr->items.push_back(parse_or());
    if (accept_name("else")) {
      expr->items.push_back(parse_expression());
    } else {
      auto undefined = make(Expr::Kind::Literal);  // `x if c` without else yields undefined
      expr->items.push_back(std::move(undefined));
    }
    return expr;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (accept_name("or")) left = make_binary("or", std::move(left), parse_and());
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (accept_name("and")) left = make_binary("and", std::move(left), parse_not());
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      ++pos_;
      ExprPtr expr = make(Expr::Kind::Unary);
      expr->name = "not";
      expr->object = parse_not();
      return expr;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr left = parse_math1();
    while (true) {
      std::string op;
      if (peek().kind == TokenKind::Operator &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == "<=" ||
           peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (accept_name("in")) {
        op = "in";
      } else if (at_name("not") && peek(1).kind == TokenKind::Name && peek(1).text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        return left;
      }
      left = make_binary(op, std::move(left), parse_math1());
    }
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      const std::string op = next().text;
      left = make_binary(op, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (accept_operator("~")) left = make_binary("~", std::move(left), parse_math2());
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const std::string op = next().text;
      left = make_binary(op, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary();
    while (accept_operator("**")) left = make_binary("**", std::move(left), parse_unary());
    return left;
  }

  ExprPtr parse_unary(bool with_filters = true) {
    ExprPtr expr;
    if (at_operator("-") || at_operator("+")) {
      expr = make(Expr::Kind::Unary);
      expr->name = next().text;
      expr->object = parse_unary(false);
    } else {
      expr = parse_postfix(parse_primary());
    }
    return with_filters ? parse_filters_and_tests(std::move(expr)) : std::move(expr);
  }

  ExprPtr parse_primary() {
    const Token& token = peek();
    ExprPtr expr = make(Expr::Kind::Literal);
    switch (token.kind) {
      case TokenKind::String:
        expr->value = Value(next().text);
        while (peek().kind == TokenKind::String) expr->value = Value(expr->value.as_string() + next().text);  // "a" "b"
        return expr;
      case TokenKind::Integer: expr->value = Value(static_cast<int64_t>(std::stoll(next().text))); return expr;
      case TokenKind::Float: expr->value = Value(std::stod(next().text)); return expr;
      case TokenKind::Name: {
        const std::string name = next().text;
        if (name == "true" || name == "True") expr->value = Value(true);
        else if (name == "false" || name == "False") expr->value = Value(false);
        else if (name == "none" || name == "None") expr->value = Value::none();
        else {
          expr->kind = Expr::Kind::Name;
          expr->name = name;
        }
        return expr;
      }
      case TokenKind::Operator:
        if (accept_operator("(")) {
          ExprPtr inner = parse_expression();
          if (at_operator(",")) {  // a tuple: behaves as a list here
            ExprPtr list = make(Expr::Kind::ListLiteral);
            list->items.push_back(std::move(inner));
            while (accept_operator(",") && !at_operator(")")) list->items.push_back(parse_expression());
            inner = std::move(list);
          }
          expect_operator(")");
          return inner;
        }
        if (accept_operator("[")) {
          expr->kind = Expr::Kind::ListLiteral;
          while (!accept_operator("]")) {
            expr->items.push_back(parse_expression());
            if (!at_operator("]")) expect_operator(",");
          }
          return expr;
        }
        if (accept_operator("{")) {
          expr->kind = Expr::Kind::DictLiteral;
          while (!accept_operator("}")) {
            expr->keys.push_back(parse_expression());
            expect_operator(":");
            expr->items.push_back(parse_expression());
            if (!at_operator("}")) expect_operator(",");
          }
          return expr;
        }
        [[fallthrough]];
      default:
        fail("unexpected '" + token.text + "' in an expression");
    }
  }

  Arguments parse_arguments() {  // after "("
    Arguments arguments;
    while (!accept_operator(")")) {
      if (peek().kind == TokenKind::Name && peek(1).kind == TokenKind::Operator && peek(1).text == "=") {
        std::string key = next().text;
        ++pos_;
        arguments.keyword.emplace_back(std::move(key), parse_expression());
      } else {
        arguments.positional.push_back(parse_expression());
      }
      if (!at_operator(")")) expect_operator(",");
    }
    return arguments;
  }

  ExprPtr parse_postfix(ExprPtr expr) {
    while (true) {
      if (accept_operator(".")) {
        ExprPtr access = make(Expr::Kind::Attribute);
        if (peek().kind == TokenKind::Integer) {  // x.0 is x[0]
          access->kind = Expr::Kind::Subscript;
          auto index = make(Expr::Kind::Literal);
          index->value = Value(static_cast<int64_t>(std::stoll(next().text)));
          access->items.push_back(std::move(index));
        } else {
          access->name = expect_name();
        }
        access->object = std::move(expr);
        expr = std::move(access);
      } else if (accept_operator("[")) {
        expr = parse_subscript(std::move(expr));
      } else if (accept_operator("(")) {
        ExprPtr call = make(Expr::Kind::Call);
        call->object = std::move(expr);
        call->arguments = parse_arguments();
        expr = std::move(call);
      } else {
        return expr;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr object) {  // after "["
    ExprPtr expr = make(Expr::Kind::Subscript);
    expr->object = std::move(object);
    std::vector<ExprPtr> parts(1);
    if (!at_operator(":")) parts[0] = parse_expression();
    while (accept_operator(":")) {
      expr->kind = Expr::Kind::Slice;
      parts.emplace_back();
      if (!at_operator(":") && !at_operator("]")) parts.back() = parse_expression();
    }
    expect_operator("]");
    if (expr->kind == Expr::Kind::Slice) parts.resize(3);
    expr->items = std::move(parts);
    return expr;
  }

  ExprPtr parse_filters_and_tests(ExprPtr expr) {
    while (true) {
      if (accept_operator("|")) {
        ExprPtr filter = make(Expr::Kind::Filter);
        filter->name = expect_name();
        if (accept_operator("(")) filter->arguments = parse_arguments();
        filter->object = std::move(expr);
        expr = std::move(filter);
      } else if (accept_name("is")) {
        ExprPtr test = make(Expr::Kind::Test);
        test->negated = accept_name("not");
        test->name = expect_name();
        if (accept_operator("(")) {
          test->arguments = parse_arguments();
        } else if (peek().kind == TokenKind::String || peek().kind == TokenKind::Integer || peek().kind == TokenKind::Float ||
                   (peek().kind == TokenKind::Name && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("in") && !at_name("not") && !at_name("is"))) {
          test->arguments.positional.push_back(parse_postfix(parse_primary()));  // `is divisibleby 3`
        }
        test->object = std::move(expr);
        expr = std::move(test);
      } else {
        return expr;
      }
    }
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens) { return Parser(tokens).parse_all(); }

}  // namespace deepfuse::jinja
