#include <cstdio>

#include "tests/core/check.h"

int main() {
  int passed = 0, failed = 0;
  for (const auto& c : sok_test::registry()) {
    const int before = sok_test::failures();
    c.fn();
    const bool ok = sok_test::failures() == before;
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", c.name);
    (ok ? passed : failed)++;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
