// The one translation unit that holds Catch2's main(); compiled once and linked into every unit test.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
