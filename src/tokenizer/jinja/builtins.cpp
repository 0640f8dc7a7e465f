#include "tokenizer/jinja/builtins.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <ctime>

#include "deepfuse/error.hpp"
#include "tokenizer/unicode.hpp"

namespace deepfuse::jinja {

void fail_at(const std::string& message, int line) {
  throw Error("chat template: " + message + " (line " + std::to_string(line) + ")");
}

namespace {

std::u32string to_u32(const std::string& s) {
  std::u32string out;
  for (size_t pos = 0; pos < s.size();) out += tokenizer::next_code_point(s, pos);
  return out;
}

std::string to_utf8(const std::u32string& s) {
  std::string out;
  for (const char32_t cp : s) tokenizer::append_utf8(out, cp);
  return out;
}

char32_t map_case(char32_t cp, bool upper) {
  const auto c = static_cast<utf8proc_int32_t>(cp);
  return static_cast<char32_t>(upper ? utf8proc_toupper(c) : utf8proc_tolower(c));
}

std::string change_case(const std::string& s, bool upper) {
  std::u32string text = to_u32(s);
  for (char32_t& cp : text) cp = map_case(cp, upper);
  return to_utf8(text);
}

bool is_cased_letter(char32_t cp) {
  return map_case(cp, true) != cp || map_case(cp, false) != cp;
}

// Python's str.title(): upper-case the first cased letter of each run of letters.
std::string title_case(const std::string& s) {
  std::u32string text = to_u32(s);
  bool previous_cased = false;
  for (char32_t& cp : text) {
    const bool cased = is_cased_letter(cp);
    cp = cased ? map_case(cp, !previous_cased) : cp;
    previous_cased = cased;
  }
  return to_utf8(text);
}

// Python's str.strip(chars): without chars, Unicode whitespace.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::u32string text = to_u32(s);
  const std::u32string set = chars && chars->is_string() ? to_u32(chars->as_string()) : std::u32string();
  const auto strippable = [&](char32_t cp) {
    return set.empty() && !(chars && chars->is_string()) ? tokenizer::is_unicode_whitespace(cp) : set.find(cp) != std::u32string::npos;
  };
  size_t begin = 0, end = text.size();
  while (left && begin < end && strippable(text[begin])) ++begin;
  while (right && end > begin && strippable(text[end - 1])) --end;
  return to_utf8(text.substr(begin, end - begin));
}

Value split(const std::string& s, const Value* separator) {
  ValueList parts;
  if (!separator || separator->is_none()) {  // runs of whitespace, no empty parts
    const std::u32string text = to_u32(s);
    std::u32string part;
    for (const char32_t cp : text) {
      if (tokenizer::is_unicode_whitespace(cp)) {
        if (!part.empty()) parts.emplace_back(to_utf8(part));
        part.clear();
      } else {
        part += cp;
      }
    }
    if (!part.empty()) parts.emplace_back(to_utf8(part));
    return Value(std::move(parts));
  }
  const std::string& sep = separator->as_string();
  if (sep.empty()) throw Error("chat template: split() got an empty separator");
  size_t start = 0;
  for (size_t found; (found = s.find(sep, start)) != std::string::npos; start = found + sep.size())
    parts.emplace_back(s.substr(start, found - start));
  parts.emplace_back(s.substr(start));
  return Value(std::move(parts));
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
  return s;
}

int64_t length_of(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::String: return static_cast<int64_t>(to_u32(v.as_string()).size());
    case Value::Kind::List: return static_cast<int64_t>(v.as_list().size());
    case Value::Kind::Dict: return static_cast<int64_t>(v.as_dict().entries.size());
    case Value::Kind::Undefined: return 0;
    default: fail_at(std::string("object of type ") + v.type_name() + " has no length", line);
  }
}

bool less_than(const Value& a, const Value& b, int line) {
  if (a.is_number() && b.is_number()) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  fail_at(std::string("cannot compare ") + a.type_name() + " and " + b.type_name(), line);
}

Value attribute_or_item(const Value& object, const std::string& attribute, int line) {
  Value current = object;
  // "a.b" walks nested attributes, as Jinja's attribute= arguments do.
  size_t start = 0;
  while (true) {
    const size_t dot = attribute.find('.', start);
    current = get_member(current, attribute.substr(start, dot - start), line);
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

Value bound(const Value& self, std::function<Value(const Value&, const CallArgs&)> method) {
  return Value::function([self, method](const CallArgs& args) { return method(self, args); });
}

// select / reject / selectattr / rejectattr: keep the items whose test result equals `keep`.
Value filter_items(const Value& input, const CallArgs& args, bool by_attribute, bool keep, int line) {
  ValueList kept;
  const size_t test_position = by_attribute ? 1 : 0;
  std::string attribute;
  if (by_attribute) {
    if (!args.get(0, "attribute")) fail_at("selectattr/rejectattr need an attribute name", line);
    attribute = args.get(0, "attribute")->as_string();
  }
  const Value* test_name = args.get(test_position, "test");
  CallArgs test_args;
  for (size_t i = test_position + 1; i < args.positional.size(); ++i) test_args.positional.push_back(args.positional[i]);
  for (const Value& item : input.iterate()) {
    const Value subject = by_attribute ? attribute_or_item(item, attribute, line) : item;
    const bool passed = test_name ? apply_test(test_name->as_string(), subject, test_args, line) : subject.truthy();
    if (passed == keep) kept.push_back(item);
  }
  return Value(std::move(kept));
}

}  // namespace

Value get_member(const Value& object, const std::string& name, int line) {
  if (object.is_undefined()) fail_at("'" + name + "' read from an undefined value", line);
  if (object.is_dict()) {
    if (const Value* entry = object.as_dict().find(name)) return *entry;
    if (object.is_namespace()) return Value();
    if (name == "items")
      return bound(object, [](const Value& self, const CallArgs&) {
        ValueList pairs;
        for (const auto& [k, v] : self.as_dict().entries) pairs.emplace_back(ValueList{Value(k), v});
        return Value(std::move(pairs));
      });
    if (name == "keys") return bound(object, [](const Value& self, const CallArgs&) { return Value(self.iterate()); });
    if (name == "values")
      return bound(object, [](const Value& self, const CallArgs&) {
        ValueList values;
        for (const auto& entry : self.as_dict().entries) values.push_back(entry.second);
        return Value(std::move(values));
      });
    if (name == "get")
      return bound(object, [](const Value& self, const CallArgs& args) {
        const Value* key = args.get(0, "key");
        const Value* found = key ? self.as_dict().find(key->as_string()) : nullptr;
        if (found) return *found;
        const Value* fallback = args.get(1, "default");
        return fallback ? *fallback : Value::none();
      });
    return Value();
  }
  if (object.is_string()) {
    const auto string_method = [&](auto fn) {
      return bound(object, [fn](const Value& self, const CallArgs& args) { return fn(self.as_string(), args); });
    };
    if (name == "strip") return string_method([](const std::string& s, const CallArgs& a) { return Value(strip(s, a.get(0, "chars"), true, true)); });
    if (name == "lstrip") return string_method([](const std::string& s, const CallArgs& a) { return Value(strip(s, a.get(0, "chars"), true, false)); });
    if (name == "rstrip") return string_method([](const std::string& s, const CallArgs& a) { return Value(strip(s, a.get(0, "chars"), false, true)); });
    if (name == "split") return string_method([](const std::string& s, const CallArgs& a) { return split(s, a.get(0, "sep")); });
    if (name == "upper") return string_method([](const std::string& s, const CallArgs&) { return Value(change_case(s, true)); });
    if (name == "lower") return string_method([](const std::string& s, const CallArgs&) { return Value(change_case(s, false)); });
    if (name == "title") return string_method([](const std::string& s, const CallArgs&) { return Value(title_case(s)); });
    if (name == "startswith")
      return string_method([](const std::string& s, const CallArgs& a) { return Value(s.rfind(a.positional.at(0).as_string(), 0) == 0); });
    if (name == "endswith")
      return string_method([](const std::string& s, const CallArgs& a) {
        const std::string& suffix = a.positional.at(0).as_string();
        return Value(s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0);
      });
    if (name == "replace")
      return string_method([](const std::string& s, const CallArgs& a) {
        return Value(replace_all(s, a.positional.at(0).as_string(), a.positional.at(1).as_string()));
      });
  }
  // As in Jinja, a missing attribute is undefined (`message.content.content is defined` on a
  // string content, in Mistral's template); calling it fails, naming the method.
  (void)line;
  return Value();
}

Value get_item(const Value& object, const Value& index, int line) {
  if (object.is_dict()) {
    if (!index.is_string()) return Value();
    const Value* entry = object.as_dict().find(index.as_string());
    return entry ? *entry : Value();
  }
  if (object.is_list() || object.is_string()) {
    if (!index.is_number()) fail_at("list indices must be integers", line);
    const ValueList items = object.is_list() ? object.as_list() : object.iterate();
    int64_t i = index.as_int();
    if (i < 0) i += static_cast<int64_t>(items.size());
    if (i < 0 || i >= static_cast<int64_t>(items.size())) return Value();
    return items[static_cast<size_t>(i)];
  }
  if (object.is_undefined()) fail_at("subscript of an undefined value", line);
  fail_at(std::string("a ") + object.type_name() + " cannot be subscripted", line);
}

Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step, int line) {
  if (!object.is_list() && !object.is_string()) fail_at(std::string("a ") + object.type_name() + " cannot be sliced", line);
  const ValueList items = object.is_list() ? object.as_list() : object.iterate();
  const auto n = static_cast<int64_t>(items.size());
  const int64_t stride = step.is_none() || step.is_undefined() ? 1 : step.as_int();
  if (stride == 0) fail_at("slice step cannot be zero", line);
  // Python's slice.indices().
  const auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none() || v.is_undefined()) return fallback;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    return stride > 0 ? std::clamp<int64_t>(i, 0, n) : std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t begin = clamp(start, stride > 0 ? 0 : n - 1), end = clamp(stop, stride > 0 ? n : -1);
  ValueList picked;
  for (int64_t i = begin; stride > 0 ? i < end : i > end; i += stride) picked.push_back(items[static_cast<size_t>(i)]);
  if (object.is_list()) return Value(std::move(picked));
  std::string text;
  for (const Value& c : picked) text += c.as_string();
  return Value(std::move(text));
}

bool apply_test(const std::string& name, const Value& v, const CallArgs& args, int line) {
  const Value* arg = args.get(0, "value");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind() == Value::Kind::Int;
  if (name == "float") return v.kind() == Value::Kind::Float;
  if (name == "boolean") return v.kind() == Value::Kind::Bool;
  if (name == "true") return v.kind() == Value::Kind::Bool && v.as_bool();
  if (name == "false") return v.kind() == Value::Kind::Bool && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string();
  if (name == "callable") return v.kind() == Value::Kind::Function;
  if (name == "lower") return v.is_string() && change_case(v.as_string(), false) == v.as_string();
  if (name == "upper") return v.is_string() && change_case(v.as_string(), true) == v.as_string();
  if (name == "odd" || name == "even") return v.is_number() && (v.as_int() % 2 != 0) == (name == "odd");
  static const char* const with_argument[] = {"equalto", "eq", "==", "sameas", "ne", "!=", "divisibleby", "in", "lt", "<", "gt", ">"};
  if (std::find_if(std::begin(with_argument), std::end(with_argument), [&](const char* known) { return name == known; }) ==
      std::end(with_argument))
    fail_at("unsupported test '" + name + "'", line);
  if (!arg) fail_at("test '" + name + "' needs an argument", line);
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v == *arg;
  if (name == "ne" || name == "!=") return !(v == *arg);
  if (name == "divisibleby") return arg->as_int() != 0 && v.as_int() % arg->as_int() == 0;
  if (name == "in") {
    if (arg->is_string() && v.is_string()) return arg->as_string().find(v.as_string()) != std::string::npos;
    const ValueList items = arg->iterate();
    return std::find(items.begin(), items.end(), v) != items.end();
  }
  if (name == "lt" || name == "<") return less_than(v, *arg, line);
  if (name == "gt" || name == ">") return less_than(*arg, v, line);
  fail_at("unsupported test '" + name + "'", line);
}

Value apply_filter(const std::string& name, const Value& v, const CallArgs& args, int line) {
  if (name == "trim") return Value(strip(v.to_string(), args.get(0, "chars"), true, true));
  if (name == "length" || name == "count") return Value(length_of(v, line));
  if (name == "tojson") {
    const Value* indent = args.get(0, "indent");
    return Value(v.to_json(indent && indent->is_number() ? static_cast<int>(indent->as_int()) : -1));
  }
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    const bool use_fallback = v.is_undefined() || (boolean && boolean->truthy() && !v.truthy());
    return use_fallback ? (fallback ? *fallback : Value("")) : v;
  }
  if (name == "upper") return Value(change_case(v.to_string(), true));
  if (name == "lower") return Value(change_case(v.to_string(), false));
  if (name == "title") return Value(title_case(v.to_string()));
  if (name == "capitalize") {
    std::u32string text = to_u32(change_case(v.to_string(), false));
    if (!text.empty()) text[0] = map_case(text[0], true);
    return Value(to_utf8(text));
  }
  if (name == "string") return Value(v.to_string());
  if (name == "safe" || name == "e" || name == "escape") return v;  // chat templates render text, not HTML
  if (name == "int") return Value(v.is_string() ? static_cast<int64_t>(std::strtoll(v.as_string().c_str(), nullptr, 10)) : v.as_int());
  if (name == "float") return Value(v.is_string() ? std::strtod(v.as_string().c_str(), nullptr) : v.as_double());
  if (name == "abs") return v.kind() == Value::Kind::Float ? Value(std::fabs(v.as_double())) : Value(static_cast<int64_t>(std::llabs(v.as_int())));
  if (name == "replace") return Value(replace_all(v.to_string(), args.positional.at(0).to_string(), args.positional.at(1).to_string()));
  if (name == "list") return Value(v.iterate());
  if (name == "items") return get_member(v, "items", line).as_function()(CallArgs{});
  if (name == "first" || name == "last") {
    const ValueList items = v.iterate();
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    ValueList items = v.iterate();
    std::reverse(items.begin(), items.end());
    if (!v.is_string()) return Value(std::move(items));
    std::string text;
    for (const Value& c : items) text += c.as_string();
    return Value(std::move(text));
  }
  if (name == "join") {
    const Value* separator = args.get(0, "d");
    const Value* attribute = args.get(1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : v.iterate()) {
      if (!first && separator) out += separator->to_string();
      first = false;
      out += (attribute ? attribute_or_item(item, attribute->as_string(), line) : item).to_string();
    }
    return Value(std::move(out));
  }
  if (name == "unique") {
    ValueList unique;
    for (const Value& item : v.iterate())
      if (std::find(unique.begin(), unique.end(), item) == unique.end()) unique.push_back(item);
    return Value(std::move(unique));
  }
  if (name == "sort") {
    ValueList items = v.iterate();
    const Value* reverse = args.get(0, "reverse");
    const Value* attribute = args.get(2, "attribute");
    const auto key = [&](const Value& item) { return attribute ? attribute_or_item(item, attribute->as_string(), line) : item; };
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) { return less_than(key(a), key(b), line); });
    if (reverse && reverse->truthy()) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "map") {
    ValueList mapped;
    const Value* attribute = args.get(99, "attribute");
    CallArgs filter_args;
    for (size_t i = 1; i < args.positional.size(); ++i) filter_args.positional.push_back(args.positional[i]);
    for (const Value& item : v.iterate()) {
      if (attribute) {
        mapped.push_back(attribute_or_item(item, attribute->as_string(), line));
      } else if (!args.positional.empty()) {
        mapped.push_back(apply_filter(args.positional[0].as_string(), item, filter_args, line));
      } else {
        fail_at("map needs attribute= or a filter name", line);
      }
    }
    return Value(std::move(mapped));
  }
  if (name == "select") return filter_items(v, args, false, true, line);
  if (name == "reject") return filter_items(v, args, false, false, line);
  if (name == "selectattr") return filter_items(v, args, true, true, line);
  if (name == "rejectattr") return filter_items(v, args, true, false, line);
  fail_at("unsupported filter '" + name + "'", line);
}

ValueDict global_functions() {
  ValueDict globals;
  globals.set("raise_exception", Value::function([](const CallArgs& args) -> Value {
    throw Error("chat template raised an exception: " + (args.positional.empty() ? std::string() : args.positional[0].to_string()));
  }));
  globals.set("namespace", Value::function([](const CallArgs& args) {
    ValueDict fields;
    for (const auto& [key, value] : args.keyword) fields.set(key, value);
    return Value(std::move(fields), /*is_namespace=*/true);
  }));
  globals.set("dict", Value::function([](const CallArgs& args) {
    ValueDict fields;
    for (const auto& [key, value] : args.keyword) fields.set(key, value);
    return Value(std::move(fields));
  }));
  globals.set("range", Value::function([](const CallArgs& args) {
    int64_t start = 0, stop = 0, step = 1;
    if (args.positional.size() == 1) {
      stop = args.positional[0].as_int();
    } else if (args.positional.size() >= 2) {
      start = args.positional[0].as_int();
      stop = args.positional[1].as_int();
      if (args.positional.size() >= 3) step = args.positional[2].as_int();
    }
    if (step == 0) throw Error("chat template: range() step must not be zero");
    ValueList numbers;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) numbers.emplace_back(i);
    return Value(std::move(numbers));
  }));
  globals.set("strftime_now", Value::function([](const CallArgs& args) {
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buffer[256];
    const size_t written = std::strftime(buffer, sizeof buffer, args.positional.at(0).as_string().c_str(), &local);
    return Value(std::string(buffer, written));
  }));
  return globals;
}

}  // namespace deepfuse::jinja
