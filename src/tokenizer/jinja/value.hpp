// Values of the Jinja subset that renders chat templates, with Python's semantics where
// templates can observe them: truthiness, ==, str() of None/True/floats/lists, and json.dumps
// (for the tojson filter, with Hugging Face's ensure_ascii=False and insertion-ordered keys).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepfuse::jinja {

class Value;
using ValueList = std::vector<Value>;

// Insertion-ordered string-keyed map, like a Python dict loaded from JSON.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value value);
};

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `position` or named `name`, or nullptr.
  const Value* get(size_t position, const char* name) const;
};
using Function = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);
  Value(int64_t i);
  Value(int i) : Value(static_cast<int64_t>(i)) {}
  Value(double f);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  Value(ValueList list);
  Value(ValueDict dict, bool is_namespace = false);
  static Value function(Function fn);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::Undefined; }
  bool is_none() const { return kind_ == Kind::None; }
  bool is_string() const { return kind_ == Kind::String; }
  bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float; }
  bool is_list() const { return kind_ == Kind::List; }
  bool is_dict() const { return kind_ == Kind::Dict; }
  bool is_namespace() const { return kind_ == Kind::Dict && is_namespace_; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const;    // ints, bools, and floats (truncated)
  double as_double() const;  // any number
  const std::string& as_string() const { return string_; }
  const ValueList& as_list() const { return *list_; }
  const ValueDict& as_dict() const { return *dict_; }
  ValueDict& mutable_dict() const { return *dict_; }  // namespaces are mutable through `set ns.x`
  const Function& as_function() const { return *function_; }

  bool truthy() const;
  // Python's str(): None, True, 1.5, ['a', 1], {'k': 'v'}; undefined is "".
  std::string to_string() const;
  // Python's repr() (strings quoted), used inside lists and dicts.
  std::string repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent); indent < 0 means none.
  std::string to_json(int indent = -1) const;
  // Items iterated by `for`: list elements, dict keys, string characters.
  ValueList iterate() const;
  const char* type_name() const;

  friend bool operator==(const Value& a, const Value& b);

 private:
  Kind kind_ = Kind::Undefined;
  bool bool_ = false;
  bool is_namespace_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Function> function_;
};

// Python float repr: shortest round-trip digits, always with a '.' or exponent ("1.0", "2.5").
std::string python_float_repr(double value);

}  // namespace deepfuse::jinja
