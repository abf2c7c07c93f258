// Catch2 v2's single header, for a build against Catch2 v3 (tests/CMakeLists.txt puts this directory on
// the include path only then): v3 split the header and moved main() into Catch2WithMain. The unit tests
// use only macros both versions have (TEST_CASE, SECTION, REQUIRE, CHECK, INFO, WARN, FAIL).
#pragma once
#include <catch2/catch_all.hpp>
