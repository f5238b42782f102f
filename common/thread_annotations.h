// horovod_cpp — Apache-2.0
#pragma once
// Clang thread-safety annotations (-Wthread-safety). They document which mutex guards which
// field; under GCC they expand to nothing.

#if defined(__clang__)
#define HVD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define HVD_THREAD_ANNOTATION(x)
#endif

#define HVD_GUARDED_BY(x) HVD_THREAD_ANNOTATION(guarded_by(x))
#define HVD_REQUIRES(...) HVD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define HVD_EXCLUDES(...) HVD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
