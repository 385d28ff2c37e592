// One main for every test executable, valid for Catch2 v2 and v3.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
