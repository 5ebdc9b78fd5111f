// AddressSanitizer's defaults for every test binary (ASAN_OPTIONS from the
// environment apply on top). allocator_may_return_null=1: a failed malloc
// returns null, which the library reports as kResourceExhausted and the tests
// check; by default ASan ends the process on any failed allocation, whatever
// the allocation function. Unused without ASan.
extern "C" const char* __asan_default_options();
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1";
}
