/* UNDER_ASAN: 1 when this file is compiled with AddressSanitizer (gcc's
 * __SANITIZE_ADDRESS__ or clang's address_sanitizer feature), else 0. Tests
 * that bound memory use it: under ASan freed memory waits in a quarantine
 * and the shadow reserves terabytes of address space. */
#ifndef TERSE_TEST_SANITIZER_H
#define TERSE_TEST_SANITIZER_H

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

#endif
