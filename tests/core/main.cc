#include <string>

#include "harness/check.h"

// Usage: core_test [name filter]
int main(int argc, char** argv) { return sok_test::run_all_tests(argc > 1 ? argv[1] : ""); }
