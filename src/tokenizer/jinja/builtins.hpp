// The filters, tests, methods and global functions of the Jinja subset, with the behaviour of
// Jinja2 + Python that chat templates rely on (and transformers' tojson / raise_exception /
// strftime_now). An unknown name is an error naming it.
#pragma once

#include <string>

#include "tokenizer/jinja/value.hpp"

namespace deepfuse::jinja {

[[noreturn]] void fail_at(const std::string& message, int line);

Value apply_filter(const std::string& name, const Value& input, const CallArgs& args, int line);
bool apply_test(const std::string& name, const Value& input, const CallArgs& args, int line);
// object.name: a dict entry, or a bound method of strings, dicts and lists (undefined if none).
Value get_member(const Value& object, const std::string& name, int line);
// object[index] with Python's negative indices; undefined when out of range or missing.
Value get_item(const Value& object, const Value& index, int line);
Value get_slice(const Value& object, const Value& start, const Value& stop, const Value& step, int line);
// range, namespace, dict, raise_exception, strftime_now.
ValueDict global_functions();

}  // namespace deepfuse::jinja
