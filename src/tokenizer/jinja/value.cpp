#include "tokenizer/jinja/value.hpp"

#include <charconv>
#include <cmath>

#include "deepfuse/error.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::jinja {

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void ValueDict::set(const std::string& key, Value value) {
  for (auto& [k, v] : entries) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t position, const char* name) const {
  if (position < positional.size()) return &positional[position];
  for (const auto& [key, value] : keyword)
    if (key == name) return &value;
  return nullptr;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::None;
  return v;
}
Value::Value(bool b) : kind_(Kind::Bool), bool_(b) {}
Value::Value(int64_t i) : kind_(Kind::Int), int_(i) {}
Value::Value(double f) : kind_(Kind::Float), float_(f) {}
Value::Value(std::string s) : kind_(Kind::String), string_(std::move(s)) {}
Value::Value(ValueList list) : kind_(Kind::List), list_(std::make_shared<ValueList>(std::move(list))) {}
Value::Value(ValueDict dict, bool is_namespace)
    : kind_(Kind::Dict), is_namespace_(is_namespace), dict_(std::make_shared<ValueDict>(std::move(dict))) {}

Value Value::function(Function fn) {
  Value v;
  v.kind_ = Kind::Function;
  v.function_ = std::make_shared<Function>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float: return Value(json.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList list;
      for (const auto& item : json) list.push_back(from_json(item));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      for (const auto& [key, item] : json.items()) dict.entries.emplace_back(key, from_json(item));
      return Value(std::move(dict));
    }
    default: return Value();
  }
}

int64_t Value::as_int() const {
  if (kind_ == Kind::Float) return static_cast<int64_t>(float_);
  if (kind_ == Kind::Bool) return bool_ ? 1 : 0;
  return int_;
}

double Value::as_double() const { return kind_ == Kind::Float ? float_ : static_cast<double>(as_int()); }

bool Value::truthy() const {
  switch (kind_) {
    case Kind::Undefined: case Kind::None: return false;
    case Kind::Bool: return bool_;
    case Kind::Int: return int_ != 0;
    case Kind::Float: return float_ != 0;
    case Kind::String: return !string_.empty();
    case Kind::List: return !list_->empty();
    case Kind::Dict: return is_namespace_ || !dict_->entries.empty();
    case Kind::Function: return true;
  }
  return false;
}

std::string python_float_repr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  std::string text(buffer, result.ptr);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

namespace {

// Python's repr of a string: single quotes unless the text has ' and no ".
std::string python_string_repr(const std::string& s) {
  const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out + quote;
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void append_json(std::string& out, const Value& v, int indent, int depth) {
  const auto newline = [&](int level) {
    out += '\n';
    out.append(static_cast<size_t>(indent * level), ' ');
  };
  // json.dumps: ", " and ": " without indent; "," + newline and ": " with it.
  switch (v.kind()) {
    case Value::Kind::Undefined: case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.as_int()); return;
    case Value::Kind::Float: out += python_float_repr(v.as_double()); return;
    case Value::Kind::String: append_json_string(out, v.as_string()); return;
    case Value::Kind::Function: throw Error("chat template: tojson cannot serialize a function");
    case Value::Kind::List: {
      const auto& list = v.as_list();
      if (list.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < list.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        append_json(out, list[i], indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::Kind::Dict: {
      const auto& entries = v.as_dict().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(depth + 1);
        append_json_string(out, entries[i].first);
        out += ": ";
        append_json(out, entries[i].second, indent, depth + 1);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
  }
}

}  // namespace

std::string Value::to_string() const {
  switch (kind_) {
    case Kind::Undefined: return "";
    case Kind::None: return "None";
    case Kind::Bool: return bool_ ? "True" : "False";
    case Kind::Int: return std::to_string(int_);
    case Kind::Float: return python_float_repr(float_);
    case Kind::String: return string_;
    case Kind::List: {
      std::string out = "[";
      for (size_t i = 0; i < list_->size(); ++i) out += (i ? ", " : "") + (*list_)[i].repr();
      return out + "]";
    }
    case Kind::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < dict_->entries.size(); ++i)
        out += (i ? ", " : "") + python_string_repr(dict_->entries[i].first) + ": " + dict_->entries[i].second.repr();
      return out + "}";
    }
    case Kind::Function: return "<function>";
  }
  return "";
}

std::string Value::repr() const { return kind_ == Kind::String ? python_string_repr(string_) : to_string(); }

std::string Value::to_json(int indent) const {
  std::string out;
  append_json(out, *this, indent, 0);
  return out;
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::Undefined: return {};
    case Kind::List: return *list_;
    case Kind::Dict: {
      ValueList keys;
      for (const auto& entry : dict_->entries) keys.emplace_back(entry.first);
      return keys;
    }
    case Kind::String: {
      ValueList chars;
      for (size_t pos = 0; pos < string_.size();) {
        const size_t start = pos;
        tokenizer::next_code_point(string_, pos);
        chars.emplace_back(string_.substr(start, pos - start));
      }
      return chars;
    }
    default: throw Error(std::string("chat template: cannot iterate over ") + type_name());
  }
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::Undefined: return "undefined";
    case Kind::None: return "none";
    case Kind::Bool: return "boolean";
    case Kind::Int: return "integer";
    case Kind::Float: return "float";
    case Kind::String: return "string";
    case Kind::List: return "list";
    case Kind::Dict: return is_namespace_ ? "namespace" : "dict";
    case Kind::Function: return "function";
  }
  return "?";
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if ((a.kind_ == Value::Kind::Bool) != (b.kind_ == Value::Kind::Bool)) {
    // Python: True == 1. Only numbers and bools mix.
    const auto numeric = [](const Value& v) { return v.is_number() || v.kind_ == Value::Kind::Bool; };
    return numeric(a) && numeric(b) && a.as_double() == b.as_double();
  }
  if (a.kind_ != b.kind_) return false;
  switch (a.kind_) {
    case Value::Kind::Undefined: case Value::Kind::None: return true;
    case Value::Kind::Bool: return a.bool_ == b.bool_;
    case Value::Kind::String: return a.string_ == b.string_;
    case Value::Kind::List: return *a.list_ == *b.list_;
    case Value::Kind::Dict: {
      if (a.dict_->entries.size() != b.dict_->entries.size()) return false;
      for (const auto& [key, value] : a.dict_->entries) {
        const Value* other = b.dict_->find(key);
        if (!other || !(*other == value)) return false;
      }
      return true;
    }
    default: return a.function_ == b.function_;
  }
}

}  // namespace deepfuse::jinja
