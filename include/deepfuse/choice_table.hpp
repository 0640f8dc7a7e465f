// One table per choice: a choice enum's values, names, descriptions and whatever else it maps to
// (a kernel's enum, a count) are the rows of `ChoiceTable<Choice>::rows`, a constexpr array
// specialised next to the enum (deepfuse/plan_choices.hpp for the decode plan's). Everything that
// names, parses, lists or maps a choice goes through these templates, so adding a value is adding a
// row. A row has at least `value`, `name` and `about`; rows are in the enum's order.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "deepfuse/error.hpp"

namespace deepfuse {

template <typename Choice>
struct ChoiceTable;  // specialised per choice: static constexpr std::array<Row, N> rows

// The row of a choice that maps to nothing else (a choice with more columns has its own row type).
template <typename Choice>
struct ChoiceRow {
  Choice value;
  const char* name;
  const char* about;
};

template <typename Choice>
constexpr const auto& choice_rows() {
  return ChoiceTable<Choice>::rows;
}

// For a static_assert beside each table: the rows are the enum's values 0, 1, ... in order (so a
// row can be found by value) and their names are distinct and not empty.
template <typename Choice>
constexpr bool choice_table_well_formed() {
  const auto& rows = choice_rows<Choice>();
  for (size_t i = 0; i < rows.size(); ++i) {
    if (static_cast<size_t>(rows[i].value) != i || std::string_view(rows[i].name).empty()) return false;
    for (size_t j = 0; j < i; ++j)
      if (std::string_view(rows[i].name) == rows[j].name) return false;
  }
  return true;
}

// The row of `choice`; a value without a row (a cast from a bad integer) is an error, never a
// neighbour's row.
template <typename Choice>
constexpr const auto& choice_row(Choice choice) {
  const auto& rows = choice_rows<Choice>();
  const auto index = static_cast<size_t>(choice);
  if (index >= rows.size()) throw Error("choice value " + std::to_string(index) + " has no row in its table");
  return rows[index];
}

template <typename Choice>
constexpr const char* choice_name(Choice choice) {
  return choice_row(choice).name;
}

// Every value, in the table's order.
template <typename Choice>
constexpr auto all_choices() {
  const auto& rows = choice_rows<Choice>();
  std::array<Choice, std::tuple_size_v<std::remove_cvref_t<decltype(rows)>>> values{};
  for (size_t i = 0; i < rows.size(); ++i) values[i] = rows[i].value;
  return values;
}

// The value named `name`, or none.
template <typename Choice>
constexpr std::optional<Choice> parse_choice(std::string_view name) {
  for (const auto& row : choice_rows<Choice>())
    if (name == row.name) return row.value;
  return std::nullopt;
}

// The names for messages and help: "a, b or c" by default, "a, b, c" with last ", ", "a|b|c"
// with both "|".
template <typename Choice>
std::string choice_names(std::string_view separator = ", ", std::string_view last = " or ") {
  const auto& rows = choice_rows<Choice>();
  std::string text;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) text += i + 1 == rows.size() ? last : separator;
    text += rows[i].name;
  }
  return text;
}

// A table column over a choice: as wide as its header or the choice's longest name.
template <typename Choice>
constexpr int choice_column_width(std::string_view header) {
  size_t width = header.size();
  for (const auto& row : choice_rows<Choice>()) width = std::max(width, std::string_view(row.name).size());
  return static_cast<int>(width);
}

}  // namespace deepfuse
