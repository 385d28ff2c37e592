// Catch2 v3 when available, else v2 (Debian's catch2 package).
#if __has_include(<catch2/catch_all.hpp>)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
