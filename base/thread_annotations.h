// horovod_cpp — Apache-2.0
#pragma once
// Clang thread-safety annotations. They say which mutex guards which field and which
// functions need it held; `./test.sh` builds the core with clang -Wthread-safety -Werror
// (build-tsan, scripts/build_checks.sh), so a field touched without its mutex fails the
// build. Under GCC they expand to nothing. Use them with hvd::Mutex (base/mutex.h):
// std::mutex carries no capability attribute in libstdc++, so guards naming one would not be
// checked.

#if defined(__clang__)
#define HVD_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define HVD_THREAD_ANNOTATION(x)
#endif

#define HVD_CAPABILITY(x) HVD_THREAD_ANNOTATION(capability(x))
#define HVD_SCOPED_CAPABILITY HVD_THREAD_ANNOTATION(scoped_lockable)
#define HVD_GUARDED_BY(x) HVD_THREAD_ANNOTATION(guarded_by(x))
#define HVD_PT_GUARDED_BY(x) HVD_THREAD_ANNOTATION(pt_guarded_by(x))
#define HVD_REQUIRES(...) HVD_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define HVD_EXCLUDES(...) HVD_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define HVD_ACQUIRE(...) HVD_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define HVD_RELEASE(...) HVD_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define HVD_NO_THREAD_SAFETY_ANALYSIS HVD_THREAD_ANNOTATION(no_thread_safety_analysis)
