// bitrefit/core/crash_points.hpp — where a test may make a component "die": the CrashPoints policy.
//
// Production code names the points at which a process could die and whose recovery the tests must
// exercise (after a compare-and-set before anyone is told, after an owner published a frame, after
// a receiver applied a payload, between the writes of a durable file...). It calls
// `crash.pass(point, who)` there and nothing else. The shipped policy, `no_crash_points`, does
// nothing and is a constant no-op; tests instantiate `testing::crash_points`
// (include/bitrefit/testing/crash_points.hpp), which throws its `crash` exception at an armed
// point (or kills the process, in the demo). No production option struct carries a test hook.
//
// Concept CrashPoints: `C::crash` (the exception a simulated death throws; code that survives a
// component's death — the sender restarting a crashed owner — catches exactly this type),
// `c.pass(point, who)`. Laws: pass either returns having changed nothing observable, or throws
// C::crash; no_crash_points::pass always returns.
#pragma once

#include <concepts>
#include <exception>
#include <string_view>

namespace bitrefit {

template <class C>
concept CrashPoints = std::copy_constructible<C> && requires(C& c, std::string_view point, std::string_view who) {
  typename C::crash;
  c.pass(point, who);
};

/// The shipped policy: no point ever fires.
struct no_crash_points {
  /// Never thrown: catching it costs nothing and catches nothing.
  struct crash : std::exception {};
  constexpr void pass(std::string_view, std::string_view) const noexcept {}
};

static_assert(CrashPoints<no_crash_points>);

}  // namespace bitrefit
