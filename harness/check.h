// The C++ test harness of the GPU tests (tests/gpu, CMake + nvcc), a minimal one. (The CPU tests
// in tests/core use Debian's googletest through Bazel: WORKSPACE, third_party/googletest.)
//
//   TEST(name) { CHECK(cond); CHECK_NEAR(a, b, tol); ... }   registered, run by run_all_tests()
//   sok_test::run_case("name", fn)    runs a parameterised case (fn returns void or bool)
//   FAIL("fmt", ...)                  records a failure with a message; evaluates to false
//   sok_test::expect_near / expect_eq compare whole vectors and name the first differences
//
// Output: "PASS <name> (<ms> ms)" or "FAIL <name> (<ms> ms)" per case, failures indented above
// it as "  <file>:<line>: <message>" (the first 8 of a case), and "N passed, M failed" last.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace sok_test {

struct Case {
  std::string name;
  std::function<void()> body;
};

struct State {
  std::vector<Case> registry;
  std::string filter;  // run only the cases whose name contains it
  int passed = 0, failed = 0;
  int case_failures = 0;  // failures recorded by the running case
};
inline State& state() {
  static State s;
  return s;
}

struct Register {
  Register(const char* name, void (*body)()) { state().registry.push_back({name, body}); }
};

// Records a failure of the running case; always returns false (so `return FAIL(...)` works).
inline bool fail_at(const char* file, int line, const char* fmt, ...) {
  if (state().case_failures++ < 8) {
    std::va_list ap;
    va_start(ap, fmt);
    std::printf("  %s:%d: ", file, line);
    std::vprintf(fmt, ap);
    std::printf("\n");
    va_end(ap);
  }
  return false;
}

// Runs one case; it fails if it recorded a failure or (for a bool body) returned false.
template <typename Body>
void run_case(const std::string& name, Body&& body) {
  State& s = state();
  if (!s.filter.empty() && name.find(s.filter) == std::string::npos) return;
  s.case_failures = 0;
  const auto t0 = std::chrono::steady_clock::now();
  bool ok = true;
  if constexpr (std::is_same_v<decltype(body()), bool>) {
    ok = body();
  } else {
    body();
  }
  ok = ok && s.case_failures == 0;
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %s (%.1f ms)\n", ok ? "PASS" : "FAIL", name.c_str(), ms);
  std::fflush(stdout);
  (ok ? s.passed : s.failed)++;
}

// Prints "N passed, M failed"; the exit status of a test program.
inline int summary() {
  std::printf("%d passed, %d failed\n", state().passed, state().failed);
  return state().failed == 0 && state().passed > 0 ? 0 : 1;
}

// Runs the TEST()s whose name contains `filter` (all when empty) and prints the summary.
inline int run_all_tests(const std::string& filter = "") {
  state().filter = filter;
  for (const Case& c : state().registry) run_case(c.name, c.body);
  return summary();
}

inline bool close_enough(double got, double want, double rtol, double atol) {
  if (std::isnan(got) || std::isnan(want)) return false;
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

// Element-wise |got - want| <= atol + rtol * |want| (NaN never matches); names the first 3
// differences and how many there are.
template <typename T>
bool expect_near(const char* what, const std::vector<T>& got, const std::vector<T>& want,
                 double rtol, double atol, const char* file = __builtin_FILE(),
                 int line = __builtin_LINE()) {
  if (got.size() != want.size())
    return fail_at(file, line, "%s: size %zu vs %zu", what, got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!close_enough(static_cast<double>(got[i]), static_cast<double>(want[i]), rtol, atol) &&
        bad++ < 3) {
      fail_at(file, line, "%s[%zu]: got %.9g want %.9g", what, i, static_cast<double>(got[i]),
              static_cast<double>(want[i]));
    }
  }
  if (bad) return fail_at(file, line, "%s: %zu of %zu differ", what, bad, got.size());
  return true;
}

// Element-wise equality of integer vectors, reported like expect_near.
template <typename T>
bool expect_eq(const char* what, const std::vector<T>& got, const std::vector<T>& want,
               const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  if (got.size() != want.size())
    return fail_at(file, line, "%s: size %zu vs %zu", what, got.size(), want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(got[i] == want[i]) && bad++ < 3) {
      fail_at(file, line, "%s[%zu]: got %lld want %lld", what, i, static_cast<long long>(got[i]),
              static_cast<long long>(want[i]));
    }
  }
  if (bad) return fail_at(file, line, "%s: %zu of %zu differ", what, bad, got.size());
  return true;
}

}  // namespace sok_test

#define TEST(name)                                        \
  static void name();                                     \
  static sok_test::Register register_##name(#name, name); \
  static void name()

#define FAIL(...) sok_test::fail_at(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond) ((cond) ? true : FAIL("CHECK failed: %s", #cond))
#define CHECK_NEAR(a, b, tol) \
  CHECK(std::fabs(static_cast<double>(a) - static_cast<double>(b)) <= (tol))
