// bitrefit/core/fields.hpp — one field list per value type.
//
// BITREFIT_FIELDS(Type, a, b, c) declares `fields_of(x)`: a tuple of references to x's fields, in
// declaration order. Everything that walks a value field by field — the protocol's state hashing
// (protocol/types.hpp), the trace's JSON (wire/json.hpp) — uses it, so nothing can silently skip a
// field: the structured binding `auto& [a, b, c] = x` inside compiles only when the list names
// exactly as many fields as the type has. (The names are labels: the binding is positional.)
//
// BITREFIT_FIELDS_T(template <class M>, basic_x<M>, ...) does the same for a class template;
// BITREFIT_NO_FIELDS(Type) for an empty type. Declare them in the type's own namespace (found by
// argument-dependent lookup).
#pragma once

#include <tuple>

// clang-format off
#define BITREFIT_FIELDS_T(Template, Type, ...)                  \
  Template inline auto fields_of(const Type& x) {               \
    const auto& [__VA_ARGS__] = x;                              \
    return std::tie(__VA_ARGS__);                               \
  }                                                             \
  Template inline auto fields_of(Type& x) {                     \
    auto& [__VA_ARGS__] = x;                                    \
    return std::tie(__VA_ARGS__);                               \
  }
#define BITREFIT_FIELDS(Type, ...) BITREFIT_FIELDS_T(, Type, __VA_ARGS__)
#define BITREFIT_NO_FIELDS(Type)                                \
  inline std::tuple<> fields_of(const Type&) { return {}; }     \
  inline std::tuple<> fields_of(Type&) { return {}; }
// clang-format on

namespace bitrefit {

/// Types with a field list.
template <class T>
concept has_fields = requires(const T& x) { fields_of(x); };

}  // namespace bitrefit
