#include <gtest/gtest.h>

#include "gpuopt/errors.h"

namespace {

void check_positive(const char* name, double value) {
  GPUOPT_CHECK_VALUE(value > 0, name, " must be > 0, got ", value);
}

TEST(Errors, ValueErrorFormatsNumbersIntoTheMessage) {
  try {
    check_positive("iters", -3.5);
    FAIL() << "expected an exception";
  } catch (const gpuopt::Error& e) {
    EXPECT_EQ(e.kind(), gpuopt::ErrorKind::kValue);
    EXPECT_STREQ(e.what(), "iters must be > 0, got -3.5");
  }
}

TEST(Errors, EachMacroThrowsItsKind) {
  auto kind_of = [](auto&& fn) {
    try {
      fn();
    } catch (const gpuopt::Error& e) {
      return e.kind();
    }
    ADD_FAILURE() << "no exception";
    return gpuopt::ErrorKind::kRuntime;
  };
  EXPECT_EQ(kind_of([] { GPUOPT_CHECK_TYPE(false, "t"); }), gpuopt::ErrorKind::kType);
  EXPECT_EQ(kind_of([] { GPUOPT_CHECK_INDEX(false, "i"); }), gpuopt::ErrorKind::kIndex);
  EXPECT_EQ(kind_of([] { GPUOPT_CHECK(false, "r"); }), gpuopt::ErrorKind::kRuntime);
}

TEST(Errors, PassingChecksDoNotEvaluateTheMessage) {
  int evaluated = 0;
  auto count = [&] {
    ++evaluated;
    return "x";
  };
  GPUOPT_CHECK_VALUE(true, count());
  EXPECT_EQ(evaluated, 0);
}

}  // namespace
